// Client: federated evaluation: the model on this device's held-out data, and the final
// evaluation task.
#include "client/client_impl.h"

#include "core/evaluation.h"

namespace cleave {

namespace {

// Federated evaluation's batch: small enough for a model's activations to stay in cache
// (docs/benchmarks.md, "Local training throughput").
constexpr int kEvalBatch = 256;

}  // namespace

StatusOr<v1::ClientEvaluation> Client::Impl::EvaluateHoldout(const std::string& loss) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(EvalStats e, models.model()->Evaluate(opts.holdout, kEvalBatch, loss));
  v1::ClientEvaluation evaluation;
  evaluation.set_examples(e.examples);
  evaluation.set_accuracy(e.accuracy);
  evaluation.set_loss(e.loss);
  for (const auto& [k, v] : e.metrics) (*evaluation.mutable_metrics())[k] = v;
  evaluation.set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return evaluation;
}

Status Client::Impl::UploadFinalEvaluation(const TaskCall& c, const v1::ClientEvaluation& evaluation,
                                           int64_t examples) {
  ASSIGN_OR_RETURN(v1::UploadReply reply,
                   uploader.Upload(c.stub, c.w, c.task, ParameterSet(), examples, 0, 0, nullptr, &evaluation));
  ++tasks_done;
  spdlog::info("round {}'s model: {:.4f} accurate on {} held-out examples (final evaluation{})", c.task.round(),
               evaluation.accuracy(), evaluation.examples(), reply.duplicate() ? ", duplicate" : "");
  return absl::OkStatus();
}

Status Client::Impl::HandleEvaluationTask(const TaskCall& c) {
  auto m = models.Fetch(c.stub, c.w, c.task);
  if (!m.ok()) return c.Reject(m.status());
  if (auto set = models.Set(c.stub, c.w, c.task, *m); !set.ok()) return c.Reject(set.status());
  if (opts.holdout.size == 0) {
    return c.Reject(absl::FailedPreconditionError("no held-out data to evaluate on (--holdout)"));
  }
  c.Accept();
  // No training: an empty update that carries the evaluation.
  ASSIGN_OR_RETURN(const v1::ClientEvaluation evaluation, EvaluateHoldout(m->loss));
  return UploadFinalEvaluation(c, evaluation, opts.train.size);
}

}  // namespace cleave
