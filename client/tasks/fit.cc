// Client: a whole-model federated task: train, then upload the update (masked under
// secure aggregation, with its share of distributed DP's noise).
#include "client/client_impl.h"

#include "core/evaluation.h"
#include "proto/train_config.h"

namespace cleave {

namespace {

// Distributed DP: clips `delta` to L2 norm dp.clip, then adds this client's share of
// the noise, from a generator seeded by the OS (the server must not predict it).
void AddDpNoise(const v1::DpTask& dp, ParameterSet* delta) {
  double sq = 0;
  for (const auto& t : delta->tensors()) {
    for (float v : t.values) sq += static_cast<double>(v) * v;
  }
  const double norm = std::sqrt(sq);
  const double scale = norm > dp.clip() ? dp.clip() / norm : 1.0;
  std::mt19937_64 rng((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}());
  std::normal_distribution<double> noise(0, dp.noise_stddev());
  for (auto& t : delta->mutable_tensors()) {
    for (float& v : t.values) v = static_cast<float>(v * scale + noise(rng));
  }
}

}  // namespace

Status Client::Impl::HandleTrainingTask(const TaskCall& c) {
  const v1::Task& task = c.task;
  auto m = models.Fetch(c.stub, c.w, c.task);
  if (!m.ok()) return c.Reject(m.status());
  auto personal_names = models.Set(c.stub, c.w, c.task, *m);
  if (!personal_names.ok()) return c.Reject(personal_names.status());
  if (Status s = models.CheckMemory(task, m->spec, FitFromProto(task.train())); !s.ok()) return c.Reject(s);
  const ParameterSet& global = m->global;
  c.Accept();
  // Federated evaluation: the global model on the held-out data, before training.
  std::optional<v1::ClientEvaluation> evaluation;
  if (opts.holdout.size > 0 && !task.has_secagg() && !task.skip_evaluation()) {
    ASSIGN_OR_RETURN(evaluation, EvaluateHoldout(m->loss));
  }
  std::optional<SecAggClient> secagg;
  if (task.has_secagg()) {
    ASSIGN_OR_RETURN(secagg, SecAggClient::Prepare(c.stub, c.w, task, c.next));
  }

  LocalTrainOptions o = TrainOptions(task.train());
  o.cancel = &stop;  // Stop() (e.g. SIGTERM) does not wait for the local epochs to end
  o.seed = BatchSeed(task, c.w, opts.name);
  if (opts.keep_sent > 0) uploader.KeepFirstBatch(task, c.w, o);
  ASSIGN_OR_RETURN(TrainStats stats, models.model()->Train(opts.train, o));
  // An emulated slower device (--emulate-slowdown) takes that much longer to train; split
  // tasks idle after each step instead (split_client.cc).
  emulator.Compute(stats.seconds);
  stats.seconds *= emulator.slowdown;
  RecordTraining(stats);
  if (opts.crash_after_training && opts.crash_after_training(task.round())) {
    *c.crashed = true;
    return absl::AbortedError("simulated crash");
  }
  ParameterSet trained = models.model()->TrainedParameters();
  if (!personal_names->empty()) models.KeepPersonal(task, Only(trained, *personal_names));
  ParameterSet delta = Delta(std::move(trained), global);
  if (!opts.attack.empty() && opts.attack != "label-flip") {
    RETURN_IF_ERROR(Attack(global, o, &delta));
  }
  if (!personal_names->empty()) delta = Without(delta, *personal_names);  // stays here
  ASSIGN_OR_RETURN(v1::UploadReply reply,
                   UploadTrained(c, secagg, std::move(delta), stats, evaluation ? &*evaluation : nullptr));
  ++tasks_done;
  spdlog::info("round {}: {}trained {} examples in {:.1f}s (loss {:.4f}), update uploaded{}",
               task.round(),
               evaluation ? absl::StrFormat("global model %.4f accurate on %d held-out examples; ",
                                            evaluation->accuracy(), evaluation->examples())
                          : "",
               stats.examples, stats.seconds, stats.loss, reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

StatusOr<v1::UploadReply> Client::Impl::UploadTrained(const TaskCall& c, std::optional<SecAggClient>& secagg,
                                                      ParameterSet delta, const TrainStats& stats,
                                                      const v1::ClientEvaluation* evaluation) {
  if (secagg) {
    if (c.task.has_dp()) AddDpNoise(c.task.dp(), &delta);
    return secagg->Submit(c.stub, c.w, c.task, delta, stats.examples, stats.examples, stats.loss, stats.seconds,
                          &emulator, c.next);
  }
  return uploader.Upload(c.stub, c.w, c.task, delta, stats.examples, stats.loss, stats.seconds, nullptr, evaluation);
}

}  // namespace cleave
