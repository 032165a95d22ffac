// Client: a split-learning task: this device's part of the model trained against the
// server's (client/split_client.cc), or a pipeline's stage (client/pipeline_relay.cc).
#include "client/client_impl.h"

#include "client/pipeline_relay.h"
#include "models/kinds.h"
#include "proto/train_config.h"
#include "split/record.h"

namespace cleave {

SplitTaskOptions Client::Impl::SplitOptions(const v1::Task& task, const v1::Welcome& w, const ModelSpec& spec) {
  SplitTaskOptions so;
  so.model = spec;
  so.seed = BatchSeed(task, w, opts.name);
  so.emulator = &emulator;
  so.cancel = &stop;
  if (models.BaseFromFolder(task, spec)) {
    so.model_dir = opts.model_dir;
  } else if (!task.base_digest().empty()) {
    so.base = &models.base();
  }
  if (!task.quantized_base_digest().empty()) so.quantized = &models.quantized_base();
  if (opts.crash_after_split_step) {
    const int64_t round = task.round();
    so.crash_after_step = [this, round](int64_t step) {
      return opts.crash_after_split_step(round, step);
    };
  }
  so.peer = {opts.tls_ca, opts.tls_cert, opts.tls_key, opts.name};
  if (opts.keep_sent > 0) {
    so.sent_path = uploader.SentPath(task, w);
    so.keep_sent = opts.keep_sent;
  }
  if (opts.split_guard.enabled && !split_guard) split_guard = std::make_unique<SplitGuard>(opts.split_guard);
  so.guard = split_guard.get();
  return so;
}

Status Client::Impl::HandleSplitTask(const TaskCall& c) {
  const v1::Task& task = c.task;
  if (!hijack_suspected.ok()) return c.Reject(hijack_suspected);
  auto m = models.Fetch(c.stub, c.w, c.task);
  if (!m.ok()) return c.Reject(m.status());
  c.Accept();
  SplitTaskOptions so = SplitOptions(task, c.w, m->spec);
  if (ModelTraitsOf(m->spec.name).has_private_tensors()) {
    // A model kind with private tensors (interop): the device's stages before the cut (its
    // base and fusion) are its own, kept as personal layers: from its model's
    // initialisation until it has trained them.
    so.own = [this, &task](ParameterSet own) -> StatusOr<ParameterSet> {
      std::vector<std::string> names;
      for (const Tensor& t : own.tensors()) names.push_back(t.name);
      if (const ParameterSet& personal = models.Personal(task, names, own); personal.size() > 0) {
        RETURN_IF_ERROR(Overwrite(personal, &own));
      }
      return own;
    };
  }
  // A pipeline under secure aggregation: keys and shares before the chain runs.
  std::optional<SecAggClient> secagg;
  if (task.has_secagg()) {
    ASSIGN_OR_RETURN(secagg, SecAggClient::Prepare(c.stub, c.w, task, c.next));
  }
  // A pipeline's device past its data owner takes its micro-batches from upstream.
  auto r = task.split().has_upstream() ? RunPipelineRelay(c.stub, c.w, task, m->global, so, peer.get())
                                       : RunSplitTask(c.stub, c.w, task, m->global, opts.train, so);
  if (!r.ok() && r.status().code() == absl::StatusCode::kAborted && opts.crash_after_split_step) {
    *c.crashed = true;
    return r.status();
  }
  if (IsSplitGuardVerdict(r.status())) {
    hijack_suspected = r.status();
    spdlog::error("round {}: {}", task.round(), std::string(r.status().message()));
  }
  if (!r.ok()) return r.status();
  if (so.own != nullptr) models.KeepPersonal(task, std::move(r->own));
  const double seconds = r->stats.wall_s() * r->stats.steps();
  v1::UploadReply reply;
  if (secagg) {  // the part masked in the round's vector, weighted by the chain's owner
    ASSIGN_OR_RETURN(ParameterSet masked, MaskedPipelineVector(task.split(), Delta(r->trained, m->global)));
    ASSIGN_OR_RETURN(reply, secagg->Submit(c.stub, c.w, task, masked, r->examples, task.split().chain_weight(),
                                           r->loss, seconds, &emulator, c.next, &r->stats));
  } else {
    ASSIGN_OR_RETURN(reply, uploader.Upload(c.stub, c.w, task, Delta(r->trained, m->global), r->examples,
                                            r->loss, seconds, &r->stats));
  }
  ++tasks_done;
  if (split_guard && split_guard->fakes() > 0) {
    spdlog::info("round {}: SplitGuard: mean score {:.3f} of its last {} scores, {} fake micro-batches so far",
                 task.round(), split_guard->mean_score(), split_guard->scores(), split_guard->fakes());
  }
  spdlog::info("round {}: split task at [{}, {}) done: {} steps, {:.1f} ms/step (client {:.1f}, "
               "transfer {:.1f}, server {:.1f}), loss {:.4f}{}",
               task.round(), task.split().begin(), task.split().cut(), r->stats.steps(), 1e3 * r->stats.wall_s(),
               1e3 * r->stats.client_compute_s(), 1e3 * r->stats.transfer_s(),
               1e3 * r->stats.server_compute_s(), r->loss,
               secagg ? " (masked)" : reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

}  // namespace cleave
