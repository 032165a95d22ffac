// Coordinator: the round steps it offers its schedulers and drivers (RoundContext):
// tasks, waits, accumulation, the strategy step and publishing model versions.

#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "proto/train_config.h"
#include "server/rounds/scheduler.h"

namespace cleave {

int64_t UnixMsIn(double seconds) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
             .count() +
         static_cast<int64_t>(seconds * 1000);
}

void Coordinator::PublishModelLocked() {
  ParameterSet scratch;
  auto blob = std::make_shared<const std::string>(ModelBlob(Published(global_.weights, scratch)));
  PublishLocked(std::move(blob), Sha256Hex(*blob));
}

void Coordinator::PublishLocked(std::shared_ptr<const std::string> blob, std::string digest) {
  // Older model versions are dropped, but for those tasks may still fetch (async). The
  // fp32 size: of what the blob of the new model (global_.weights) holds.
  ParameterSet scratch;
  blobs_.PublishModel(digest, std::move(blob), static_cast<int64_t>(Published(global_.weights, scratch).EncodedSize()),
                      machinery_.scheduler().VersionsKept());
  global_.digest = std::move(digest);
}

bool Coordinator::RoundResolvedLocked() const {
  for (const auto& [id, t] : round_state().tasks) {
    if (t.state == TaskState::kAssigned || t.state == TaskState::kAccumulating) return false;
  }
  return true;
}

v1::ServerMessage Coordinator::MakeTaskLocked(int64_t round, const std::string& cid,
                                               const FitSettings& fit, int64_t deadline_ms) {
  v1::ServerMessage msg;
  v1::Task* task = msg.mutable_task();
  task->set_run_id(log_.run_id());
  task->set_round(round);
  task->set_task_id(absl::StrCat("r", round, "-", cid));
  assets_.NameIn(task);
  if (assets_.model.has_interop()) {  // this device's own base
    task->mutable_model()->mutable_interop()->set_base(config().model.interop.BaseOf(sessions_.Find(cid)->name));
  }
  auto* tc = task->mutable_train();
  ToProto(fit, tc);
  tc->set_seed(edge_ ? edge_->seed : config().run.seed * 1000003 + round);
  task->set_deadline_unix_ms(deadline_ms);
  TaskRecord rec;
  rec.client_id = cid;
  rec.round = round;
  machinery_.scheduler().ShapeTaskLocked(*sessions_.Find(cid), fit, task, &rec);
  if (round_state().evaluating) task->set_task_id(absl::StrCat("e", round, "-", cid));
  rec.id = task->task_id();
  task->set_model_digest(global_.digest);
  if (auto published = blobs_.Find(global_.digest); published.ok()) {
    task->set_model_size(static_cast<int64_t>(published->blob->size()));
  }
  if (codecs_.broadcast) task->set_model_codec(config().compression.broadcast);
  if (round_state().evaluating) {
    task->set_evaluate_only(true);
    rec.evaluate_only = true;
    rec.expected_size = static_cast<int64_t>(ParameterSet().EncodedSize());
    round_state().tasks[rec.id] = std::move(rec);
    return msg;
  }
  rec.expected_size = codecs_.update ? EncodedTensorsSize(*codecs_.update, UpdateLayout())
                                    : static_cast<int64_t>(UpdateLayout().EncodedSize());
  if (codecs_.update) {
    rec.codec = config().compression.update;
    task->set_update_codec(rec.codec);
  }
  round_state().driver->PrepareTaskLocked(task, &rec);  // split: the client part; SecAgg: masked inputs
  if (config().dp.enabled && config().dp.noise == "distributed") {
    // Each client's share of the noise: n shares sum to N(0, (z C)^2).
    task->mutable_dp()->set_clip(config().dp.clip);
    task->mutable_dp()->set_noise_stddev(config().dp.noise_multiplier * config().dp.clip /
                                         std::sqrt(static_cast<double>(round_state().clients)));
  }
  round_state().tasks[rec.id] = std::move(rec);
  return msg;
}

Status Coordinator::ApplyLocked(int64_t round,
                                const std::function<Status(const ParameterSet&)>& fold,
                                RoundMetrics* m) {
  // The server update, encoding and hashing of a large model take a while: do them on a
  // copy without the lock. No upload touches the strategy meanwhile (the round is
  // closed, or the async buffer is being applied), and readers of global_.weights see the
  // previous model.
  ParameterSet next = model_.layout.Updated(global_.weights);
  mu_.Unlock();
  Status finished = absl::OkStatus();
  // The strategy's state before it steps (server momentum, Adam moments, the DP
  // accountant, error-feedback memory): a round that fails after the step leaves no
  // trace in it.
  const ParameterSet strategy_before = strategy_.get().State();
  if (fold) finished = fold(next);
  if (finished.ok()) finished = strategy_.get().FinishRound(m->failures, &next);
  if (finished.ok()) m->strategy_stats = strategy_.get().RoundStats();
  // The step's squared norm, against the model it started from (the Run thread's, unchanged
  // until the commit; the distance is over `next`'s tensors, the updated ones).
  if (finished.ok() && noise_) m->update_noise = noise_->Estimate(SquaredDistance(next, RunThreadGlobal()));
  if (finished.ok() && !model_.layout.updates_all()) {  // the shared tensors into the whole model
    ParameterSet whole = RunThreadGlobal();
    finished = Overwrite(next, &whole);
    next = std::move(whole);
  }
  if (finished.ok()) {
    // Never commit (nor checkpoint, nor send) a model that is not finite, whatever
    // produced it: the round fails and is retried from the previous model.
    if (Status finite = CheckViews(next, ViewsOf(next)); !finite.ok()) {
      finished = absl::AbortedError(absl::StrCat("round ", round, ": the aggregate is not usable (",
                                                 finite.message(), "); not committed"));
    }
  }
  if (!finished.ok()) {
    if (Status s = strategy_.get().Restore(strategy_before); !s.ok()) {
      finished = absl::InternalError(absl::StrCat(finished.message(),
                                                  "; the strategy's state was not restored: ",
                                                  s.message()));
    }
  }
  std::shared_ptr<const std::string> blob;
  std::string digest;
  if (finished.ok()) {
    ParameterSet scratch;
    blob = std::make_shared<const std::string>(ModelBlob(Published(next, scratch)));
    digest = Sha256Hex(*blob);
  }
  mu_.Lock();
  RETURN_IF_ERROR(finished);
  global_.weights = std::move(next);
  global_.round = round;
  PublishLocked(std::move(blob), std::move(digest));
  return absl::OkStatus();
}

void Coordinator::SendTasksLocked(int64_t round, const std::vector<std::string>& cids,
                                  const RoundPlan& plan, int64_t deadline_ms) {
  std::vector<std::pair<std::shared_ptr<ClientLink>, v1::ServerMessage>> sends;
  for (const std::string& cid : cids) {
    v1::ServerMessage msg = MakeTaskLocked(round, cid, plan.FitFor(cid), deadline_ms);
    if (plan.evaluators) {  // the strategy chose who evaluates
      auto e = plan.evaluators->find(cid);
      if (e == plan.evaluators->end()) {
        msg.mutable_task()->set_skip_evaluation(true);
      } else {
        msg.mutable_task()->set_evaluate_config(e->second);
      }
    }
    sends.emplace_back(sessions_.Find(cid)->link, std::move(msg));
  }
  mu_.Unlock();  // never start gRPC operations under mu_
  std::vector<std::pair<const ClientLink*, std::string>> closed;  // (link, task id)
  for (auto& [link, msg] : sends) {
    if (!link->Send(msg)) closed.emplace_back(link.get(), msg.task().task_id());
  }
  mu_.Lock();
  for (const auto& [link, task_id] : closed) {
    auto t = round_state().tasks.find(task_id);
    if (t == round_state().tasks.end()) continue;
    const std::string client_id = t->second.client_id;
    if (t->second.state == TaskState::kAssigned) {
      FailTaskLocked(task_id, t->second, "control stream closed");
    }
    // A closed control stream does not open again: its session ends now, before the
    // transport reports it (ControlDone), so that no retried round picks it meanwhile.
    const Session* s = sessions_.Find(client_id);
    if (s != nullptr && s->link.get() == link) {
      spdlog::info("client {} disconnected", client_id);
      EndSessionLocked(client_id, "control stream closed");
      cv_.SignalAll();
    }
  }
}

void Coordinator::BeginRoundLocked(int64_t round, const std::vector<std::string>& clients,
                                   RoundHooks& driver, bool evaluate_only) {
  round_state().clients = std::max<int>(1, clients.size());
  round_state().weights = WeightsOfLocked(clients);
  if (!evaluate_only) strategy_.BeginRound(UpdateLayout());
  if (noise_) noise_->Reset();
  round_state().evaluating = evaluate_only;
  round_state().tasks.clear();
  round_state().number = round;
  ResetRoundBytes();
  round_state().driver = &driver;
}

RoundWeights Coordinator::WeightsOfLocked(const std::vector<std::string>& clients) {
  // The counts the clients declared, or (count_from_fit) last reported; one that reported
  // none yet is left out of the median. With no count known at all (a first round of
  // such clients only), every update weighs 1: nothing bounds a count a client reports.
  std::vector<int64_t> declared;
  for (const auto& cid : clients) {
    if (const Session* s = sessions_.Find(cid); s != nullptr && s->num_examples > 0) {
      declared.push_back(s->num_examples);
    }
  }
  AggregationConfig weighting = config().aggregation;
  if (declared.empty() && !clients.empty()) weighting.weighting = "equal";
  return RoundWeights(weighting, declared);
}

void Coordinator::BeginBufferLocked(int64_t version, RoundHooks& driver) {
  const std::vector<std::string> available = AvailableLocked();
  // The cap follows the connected clients; with none connected the last one holds.
  if (!available.empty()) round_state().weights = WeightsOfLocked(available);
  strategy_.BeginRound(UpdateLayout());
  round_state().number = version;
  round_state().driver = &driver;
  ResetRoundBytes();
}

void Coordinator::EndRoundLocked() {
  round_state().number = 0;
  round_state().driver = &machinery_.plain();
  round_state().evaluating = false;
  cv_.SignalAll();
}

void Coordinator::ReleaseUploadsLocked() {
  mu_.Unlock();
  uploads_.CancelAll();
  buffers_.Drop();  // not held while the next model is built beside the current one
  mu_.Lock();
}

void Coordinator::WaitLocked(Clock::time_point until) {
  clock_->WaitUntil(cv_, mu_, std::min(until, clock_->Now() + kPoll));
  ExpireSilentLocked();
}

void Coordinator::PinBlobLocked(const std::string& digest, std::shared_ptr<const std::string> blob) {
  blobs_.Pin(digest, std::move(blob));
}

void Coordinator::AddBlobLocked(const std::string& digest, std::shared_ptr<const std::string> blob,
                                int64_t fp32_size) {
  blobs_.Add(digest, std::move(blob), fp32_size);
}

std::string Coordinator::ModelBlob(const ParameterSet& model) {
  return codecs_.broadcast ? EncodeCompressedSet(*codecs_.broadcast, model) : model.Encode();
}

void Coordinator::ResetRoundBytes() {
  traffic_.StartRound();
}

void Coordinator::CountRoundBytesLocked(RoundMetrics* m) const {
  const TrafficMeter::Round r = traffic_.RoundSoFar();
  m->bytes_up = r.up;
  m->bytes_down = r.down;
  m->bytes_up_fp32 = r.up_fp32;
  m->bytes_down_fp32 = r.down_fp32;
  m->update_bytes = r.updates;
}

void Coordinator::AwaitAccumulatingLocked() {
  while (round_state().accumulating > 0) cv_.Wait(&mu_);
}

void Coordinator::Accumulate(const ClientUpdate& update) {
  strategy_.Accumulate(update, 0);
}

Status Coordinator::AwaitClientsLocked() {
  phase_ = "waiting for clients";
  const auto deadline = clock_->Now() + Seconds(config().clients.join_timeout_s);
  while (!stopping_ && static_cast<int>(AvailableLocked().size()) < config().clients.min_clients) {
    if (clock_->Now() > deadline) {
      int unfit = 0;
      for (const auto& [id, s] : sessions_) unfit += !s.unfit.empty();
      return absl::DeadlineExceededError(absl::StrCat(
          "only ", AvailableLocked().size(), " of clients.min=", config().clients.min_clients,
          " clients connected", NeedProfile() ? " and profiled" : "", " within ",
          config().clients.join_timeout_s, "s",
          unfit ? absl::StrCat(" (", unfit, " more cannot hold the model)") : ""));
    }
    WaitLocked(deadline);
  }
  return stopping_ ? absl::CancelledError("stopped") : absl::OkStatus();
}

Status Coordinator::FlTrustReference(const FitSettings& fit) {
  if (eval_.root.size == 0) return absl::OkStatus();
  const ParameterSet& global = RunThreadGlobal();
  RETURN_IF_ERROR(eval_.model->SetParameters(global));
  const LocalTrainOptions o(fit, config().run.seed);
  RETURN_IF_ERROR(eval_.model->Train(eval_.root, o).status());
  ParameterSet update = model_.layout.Updated(eval_.model->Parameters());
  const ParameterSet base = model_.layout.Updated(global);
  for (size_t i = 0; i < update.size(); ++i) {
    auto& v = update.mutable_tensors()[i].values;
    for (size_t j = 0; j < v.size(); ++j) v[j] -= base.tensors()[i].values[j];
  }
  double sq = 0;
  for (const auto& t : update.tensors()) {
    for (float v : t.values) sq += static_cast<double>(v) * v;
  }
  spdlog::info("fltrust: server update on {} root examples, {} epochs, norm {:.4f}", eval_.root.size,
               o.local_epochs, std::sqrt(sq));
  strategy_.get().SetReference(update);
  return absl::OkStatus();
}

}  // namespace cleave
