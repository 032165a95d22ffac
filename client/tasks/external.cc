// Client: tasks run by the caller's own code (ClientOptions::external: the Python
// package's NumPyClient), whole-model or its stages of a split model.
#include "aggregation/accumulate.h"
#include "client/client_impl.h"

#include "core/evaluation.h"
#include "proto/train_config.h"
#include "split/names.h"

namespace cleave {

StatusOr<v1::ClientEvaluation> Client::Impl::EvaluateExternal(const v1::Task& task,
                                                              const ClientOptions::External::Global& global) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(ClientOptions::ExternalEvaluation e, opts.external.evaluate(task, global));
  if (e.examples < 0 || !std::isfinite(e.loss) || !std::isfinite(e.accuracy)) {
    return absl::InvalidArgumentError(absl::StrCat("evaluate returned ", e.examples, " examples, loss ", e.loss,
                                                   ", accuracy ", e.accuracy));
  }
  v1::ClientEvaluation evaluation;
  evaluation.set_examples(e.examples);
  evaluation.set_accuracy(e.accuracy);
  evaluation.set_loss(e.loss);
  for (const auto& [k, v] : e.metrics) {  // what the server takes; the rest stays here
    if (evaluation.metrics_size() < kMaxEvaluationMetrics && ValidEvaluationMetric(k, v)) {
      (*evaluation.mutable_metrics())[k] = v;
    }
  }
  evaluation.set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return evaluation;
}

Status Client::Impl::HandleExternalTask(const TaskCall& c) {
  const v1::Task& task = c.task;
  if (task.has_split() || task.has_gossip() || !task.base_digest().empty() || !task.quantized_base_digest().empty() ||
      task.model().personal_size() > 0 || task.model().width() > 0 || task.model().has_lora() ||
      task.model().has_interop()) {
    return c.Reject(absl::FailedPreconditionError(
        "this client trains in its own code (fit): it takes whole-model federated tasks only, not split learning, "
        "gossip, width-scaled submodels, LoRA or quantized bases, personal layers or private bases"));
  }
  if (task.evaluate_only() && !opts.external.evaluate) {
    return c.Reject(absl::FailedPreconditionError("no evaluate to run the final evaluation with"));
  }
  auto fetched = models.FetchGlobal(c.stub, c.w, task);
  if (!fetched.ok()) return c.Reject(fetched.status());
  c.Accept();
  const auto global = std::make_shared<const ParameterSet>(*std::move(fetched));
  std::optional<v1::ClientEvaluation> evaluation;
  // Federated evaluation, before training (not of a masked task: one client's numbers
  // would show what masking hides).
  if (opts.external.evaluate && (task.evaluate_only() || (!task.has_secagg() && !task.skip_evaluation()))) {
    ASSIGN_OR_RETURN(evaluation, EvaluateExternal(task, global));
  }
  if (task.evaluate_only()) return UploadFinalEvaluation(c, *evaluation, evaluation->examples());
  std::optional<SecAggClient> secagg;
  if (task.has_secagg()) {
    ASSIGN_OR_RETURN(secagg, SecAggClient::Prepare(c.stub, c.w, task, c.next));
  }
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(ClientOptions::ExternalFit fit, opts.external.fit(task, global));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (fit.examples <= 0 || !std::isfinite(fit.loss)) {
    return absl::InvalidArgumentError(absl::StrCat("fit returned ", fit.examples, " examples and loss ", fit.loss));
  }
  if (Status s = CheckViews(*global, fit.parameters); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("fit returned parameters that are not the model's: ", s.message()));
  }
  if (opts.crash_after_training && opts.crash_after_training(task.round())) {
    *c.crashed = true;
    return absl::AbortedError("simulated crash");
  }
  // The update: the returned tensors, read where they are, less the global model.
  ParameterSet delta = global->ZerosLike();
  AddScaled(fit.parameters, 1.0f, &delta);
  AddScaled(ViewsOf(*global), -1.0f, &delta);
  fit.keep.reset();
  const TrainStats stats{fit.loss, opts.count_from_fit ? fit.examples : std::min(fit.examples, DeclaredExamples()),
                         seconds};
  RecordTraining(stats);
  ASSIGN_OR_RETURN(v1::UploadReply reply,
                   UploadTrained(c, secagg, std::move(delta), stats, evaluation ? &*evaluation : nullptr));
  ++tasks_done;
  spdlog::info("round {}: fit trained {} examples in {:.2f}s (loss {:.4f}), update uploaded{}", task.round(),
               stats.examples, seconds, fit.loss, reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

Status Client::Impl::HandleExternalSplitTask(const TaskCall& c) {
  const v1::Task& task = c.task;
  const v1::SplitTask& st = task.split();
  const StatusOr<SplitMode> mode = ParseSplitMode(st.mode());
  const bool plain = mode.ok() && (*mode == SplitMode::kSl || *mode == SplitMode::kSflV1 || *mode == SplitMode::kSflV2);
  if (!plain || !task.base_digest().empty() ||
      !task.quantized_base_digest().empty() || task.model().has_interop() || task.has_secagg() ||
      task.model().width() > 0 || st.label_epsilon() > 0) {
    return c.Reject(absl::FailedPreconditionError(
        "this client's stages are its own code: it takes sl, sfl-v1 and sfl-v2 tasks of a model without frozen, "
        "quantized or private tensors, not U-shaped, pipeline, submodel, masked or label-DP ones"));
  }
  auto part = models.FetchGlobal(c.stub, c.w, task);
  if (!part.ok()) return c.Reject(part.status());
  c.Accept();
  SplitTaskOptions so;
  so.seed = BatchSeed(task, c.w, opts.name);
  so.emulator = &emulator;
  so.cancel = &stop;
  so.external = opts.external.split.get();
  ASSIGN_OR_RETURN(SplitTaskResult r, RunSplitTask(c.stub, c.w, task, *part, Dataset(), so));
  const double seconds = r.stats.wall_s() * r.stats.steps();
  RecordTraining(TrainStats{r.loss, r.examples, seconds});
  ASSIGN_OR_RETURN(v1::UploadReply reply,
                   uploader.Upload(c.stub, c.w, task, Delta(r.trained, *part), r.examples, r.loss, seconds, &r.stats));
  ++tasks_done;
  spdlog::info("round {}: split task at cut {} done: {} steps, {:.1f} ms/step, loss {:.4f}{}", task.round(), st.cut(),
               r.stats.steps(), 1e3 * r.stats.wall_s(), r.loss, reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

}  // namespace cleave
