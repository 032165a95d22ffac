// Coordinator: uploads. Header checks under the lock, validation and accumulation
// without it (docs/architecture.md, "The server"), and the blobs clients fetch.

#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/evaluation.h"
#include "core/files.h"
#include "core/printable.h"
#include "server/rounds/scheduler.h"
#include "split/record.h"

namespace cleave {

namespace {

// The most examples a count_from_fit client's upload may report (its weight is capped
// far lower, by the round's median): 2^40.
constexpr int64_t kMaxReportedExamples = int64_t{1} << 40;

// Whether task `t` still takes an upload: OK, or OK with *duplicate when one was already
// counted; refused when the task failed or another upload of it is being added.
Status TaskTakesUpload(const std::string& task_id, const TaskRecord& t, bool* duplicate) {
  switch (t.state) {
    case TaskState::kAssigned:
      return absl::OkStatus();
    case TaskState::kDone:
      *duplicate = true;
      return absl::OkStatus();
    case TaskState::kFailed:
      return absl::FailedPreconditionError(
          absl::StrCat("task ", Printable(task_id), " was already counted as failed",
                       t.failure.empty() ? "" : " (" + t.failure + ")"));
    case TaskState::kAccumulating:
      return absl::AbortedError(
          absl::StrCat("an upload of task ", Printable(task_id), " is being added; retry"));
  }
  return absl::InternalError("unknown task state");
}

}  // namespace

StatusOr<int64_t> Coordinator::CheckUploadHeader(const v1::UploadHeader& h,
                                                  const std::string& peer, bool* duplicate) {
  MutexLock l(&mu_);
  ASSIGN_OR_RETURN(const Session* s, CheckSenderLocked("upload", h.client_id(), h.session_token(),
                                                       peer, h.run_id(), h.round()));
  auto t = round_state().tasks.find(h.task_id());
  if (t == round_state().tasks.end() || t->second.client_id != h.client_id()) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", Printable(h.task_id()), " was not given to client ",
                     Printable(h.client_id()), " in round ", round_state().number));
  }
  if (h.round() != t->second.round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "task ", Printable(h.task_id()), " was given in round ", t->second.round, ", not ",
        h.round()));
  }
  RETURN_IF_ERROR(TaskTakesUpload(h.task_id(), t->second, duplicate));
  if (*duplicate) return int64_t{0};
  if (h.codec() != t->second.codec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update codec '", Printable(h.codec()), "', the task asked for '", t->second.codec, "'"));
  }
  // A count_from_fit session's upload reports its count (a training upload's weight is
  // capped by the round's median as a declared count is); any other claims at most what
  // it declared.
  const int64_t declared = s->count_from_fit ? kMaxReportedExamples : s->num_examples;
  if (h.num_examples() <= 0 || h.num_examples() > declared) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_examples ", h.num_examples(), " is not in [1, ", declared,
                     "] (the client's declared data size)"));
  }
  if (!std::isfinite(h.train_loss())) {
    return absl::InvalidArgumentError("train_loss is not finite");
  }
  if (h.has_evaluation()) {
    // Held-out data is at most 90 % of a client's data (--holdout <= 0.9): 9x its
    // declared training examples.
    const auto& e = h.evaluation();
    const int64_t data = s->count_from_fit ? std::max(s->num_examples, h.num_examples()) : s->num_examples;
    if (e.examples() < 1 || e.examples() > 9 * data || !(e.accuracy() >= 0) ||
        !(e.accuracy() <= 1) || !std::isfinite(e.loss()) || e.loss() < 0 ||
        !std::isfinite(e.seconds()) || e.seconds() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "evaluation: examples must be in [1, ", 9 * data,
          "], accuracy in [0, 1], loss and seconds finite and >= 0"));
    }
    if (e.metrics_size() > kMaxEvaluationMetrics) {
      return absl::InvalidArgumentError(
          absl::StrCat("evaluation: ", e.metrics_size(), " metrics; at most ", kMaxEvaluationMetrics));
    }
    for (const auto& [k, v] : e.metrics()) {
      if (!ValidEvaluationMetric(k, v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "evaluation: metric '", Printable(k), "' unknown or out of range"));
      }
    }
  }
  const int64_t expected = t->second.expected_size;
  if (h.total_size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "upload announces ", h.total_size(), " bytes; an update of this model has ", expected));
  }
  RETURN_IF_ERROR(round_state().driver->CheckUploadLocked(t->second, h));  // split, gossip: their stats
  return expected;
}

Status Coordinator::ProcessUpload(const v1::UploadHeader& h, const std::string& payload,
                                  bool* duplicate) {
  // Structure checks need no lock; the payload is ours.
  std::vector<TensorView> views;
  if (h.codec() == "fp32") {
    ASSIGN_OR_RETURN(views, ParseParameterSet(payload, config().server.max_model_elements));
  }
  ClaimedUpload claim;
  {
    MutexLock l(&mu_);
    ASSIGN_OR_RETURN(claim, ClaimUploadLocked(h, payload, duplicate));
    if (claim.resolved) return absl::OkStatus();
  }
  // Model-sized work without the coordinator's lock: uploads are checked and added in
  // parallel on the workers, each into its own partial sum (ShardedStrategy).
  if (opts_.before_accumulate) opts_.before_accumulate();
  Status s = AddClaimed(h, payload, std::move(views), claim);
  MutexLock l(&mu_);
  --round_state().accumulating;
  cv_.SignalAll();
  TaskRecord& t = round_state().tasks.at(h.task_id());  // still there: the round waits for us
  if (!s.ok()) {
    // Refused: the task is as it was, unless its client left meanwhile.
    t.state = TaskState::kAssigned;
    machinery_.scheduler().UnadmitLocked();
    if (sessions_.Find(t.client_id) == nullptr) FailTaskLocked(h.task_id(), t, "disconnected");
    return s;
  }
  t.resolved_in = round_state().number;
  AcceptLocked(t, h, claim.update.weight, payload.size(), *claim.layout);
  return absl::OkStatus();
}

StatusOr<Coordinator::ClaimedUpload> Coordinator::ClaimUploadLocked(const v1::UploadHeader& h,
                                                                    const std::string& payload,
                                                                    bool* duplicate) {
  static const ParameterSet kNothing;  // an evaluation task's upload
  ClaimedUpload claim;
  // Re-check under the lock: the round may have closed while we were reading.
  const bool open = machinery_.scheduler().OpenForLocked(h.round());
  auto t = round_state().tasks.find(h.task_id());
  if (!open || t == round_state().tasks.end() || t->second.client_id != h.client_id()) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", h.round(), " closed before the upload completed"));
  }
  TaskRecord& task = t->second;
  RETURN_IF_ERROR(TaskTakesUpload(h.task_id(), task, duplicate));
  claim.resolved = *duplicate;
  if (*duplicate) return claim;
  if (task.evaluate_only && h.evaluation().examples() == 0) {
    return absl::InvalidArgumentError("an evaluation task's upload must carry its evaluation");
  }
  ASSIGN_OR_RETURN(claim.scale, machinery_.scheduler().AdmitLocked(h.task_id(), task, h));
  const ParameterSet* own = round_state().driver->UploadLayoutLocked(task);  // split: the client part
  claim.layout = own ? own : task.evaluate_only ? &kNothing : &UpdateLayout();
  const int64_t weight = round_state().weights.Weight(h.num_examples());
  Status taken;
  if (round_state().driver->TakeLocked(h, payload, task, &taken)) {  // a masked input, added whole
    if (!taken.ok()) {
      machinery_.scheduler().UnadmitLocked();
      return taken;
    }
    AcceptLocked(task, h, weight, payload.size(), *claim.layout);
    claim.resolved = true;
    return claim;
  }
  if (task.evaluate_only) {  // nothing to add
    AcceptLocked(task, h, weight, payload.size(), *claim.layout);
    claim.resolved = true;
    return claim;
  }
  claim.add = round_state().driver->ClaimUploadLocked(task);
  // server.record_updates: a whole model's update, while the global model is still the
  // one it started from (an asynchronous buffer may have moved on).
  if (config().server.record_updates > 0 && own == nullptr && task.width == 0 && task.round == round_state().number) {
    if (round_state().recorded_round != round_state().number) round_state().recorded_round = round_state().number, round_state().recorded_updates = 0;
    if (round_state().recorded_updates < config().server.record_updates) {
      ++round_state().recorded_updates;
      claim.update_record_path = RunPath(absl::StrCat("record/round-", task.round, "/", h.client_id(), ".pb"));
      claim.update_record_base = GlobalLocked();
    }
  }
  ClientUpdate& update = claim.update;
  update.client_id = h.client_id();
  const Session* s = sessions_.Find(h.client_id());
  update.client_name = s != nullptr ? s->name : h.client_id();
  update.base_version = task.round - 1;
  update.staleness = task.staleness;
  update.weight = weight;
  update.train_loss = h.train_loss();
  if (machinery_.scheduler().Records()) {
    BufferEntry& record = claim.record.emplace();
    record.version = round_state().number;
    record.task_round = task.round;
    record.staleness = task.staleness;
    record.weight = weight;
    record.scale = claim.scale;
    record.train_loss = h.train_loss();
    record.steps = task.steps;
    record.width = task.width;
    record.edge = task.edge;
    record.client_name = update.client_name;
    record.codec = h.codec();
  }
  task.state = TaskState::kAccumulating;
  ++round_state().accumulating;
  return claim;
}

void Coordinator::RecordUpdate(const ClaimedUpload& claim, const std::vector<TensorView>& views) {
  SplitRecord r;
  r.part = claim.update_record_base;
  for (const TensorView& v : views) {
    Tensor t{std::string(v.name), v.shape, std::vector<float>(v.numel)};
    v.Read(0, v.numel, t.values.data());
    (void)r.update.Add(std::move(t));
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(claim.update_record_path).parent_path(), ec);
  if (Status s = WriteFileAtomic(claim.update_record_path, EncodeSplitRecord(r)); !s.ok()) {
    spdlog::warn("server.record_updates: {}", s.ToString());
  }
}

Status Coordinator::AddClaimed(const v1::UploadHeader& h, const std::string& payload,
                               std::vector<TensorView> views, ClaimedUpload& claim) {
  if (h.codec() != "fp32") {
    // Checked here, then read block by block through the codec like an fp32 update:
    // no decoded copy is made.
    ASSIGN_OR_RETURN(views, ViewEncodedTensors(*codecs_.update, payload, *claim.layout));
  }
  // Bounded values: with bounded weights no sum of updates can overflow, so no upload
  // can make the model non-finite.
  RETURN_IF_ERROR(
      CheckViews(*claim.layout, views, static_cast<float>(config().server.max_update_abs)));
  if (!claim.update_record_path.empty()) RecordUpdate(claim, views);
  for (auto& v : views) v.scale = claim.scale;
  if (claim.record) {  // durable before it is added (async: the buffer survives a crash)
    claim.record->payload = payload;
    RETURN_IF_ERROR(machinery_.scheduler().Record(*claim.record));
  }
  if (claim.add) return claim.add(views, claim.update.weight);
  if (noise_) noise_->Add(views, static_cast<double>(claim.update.weight));
  claim.update.delta = std::move(views);
  // Each worker adds into its own partial sum; threads outside the pool share the last.
  strategy_.Accumulate(claim.update, pool_.WorkerIndex());
  return absl::OkStatus();
}

void Coordinator::AcceptLocked(TaskRecord& t, const v1::UploadHeader& h, int64_t weight,
                               size_t payload_size, const ParameterSet& layout) {
  if (h.codec() != "fp32") {
    SavedUp(static_cast<int64_t>(layout.EncodedSize()) - static_cast<int64_t>(payload_size));
  }
  traffic_.AcceptedUpdate(static_cast<int64_t>(payload_size));
  t.state = TaskState::kDone;
  t.train_loss = h.train_loss();
  t.num_examples = weight;
  t.evaluation = h.evaluation();
  if (h.evaluation().examples() > 0) log_.ClientsEvaluate();
  t.train_seconds = h.train_seconds();
  if (Session* s = sessions_.Find(t.client_id); s != nullptr && !t.evaluate_only) {
    ++s->done;
    s->task_s = h.train_seconds();
    // Its count from now on: the median that caps later rounds counts it.
    if (s->count_from_fit) s->num_examples = h.num_examples();
  }
  t.done_at = clock_->Now();
  round_state().driver->AcceptedLocked(t, h);
  machinery_.scheduler().AcceptedLocked(t, h);
  if (t.evaluate_only) {
    spdlog::info("round {}: evaluation from {} accepted (accuracy {:.4f} on {} examples)",
                 round_state().number, h.client_id(), h.evaluation().accuracy(), h.evaluation().examples());
  } else {
    spdlog::info("round {}: update from {} accepted ({} examples, weight {}, loss {:.4f}, {:.1f}s)",
                 round_state().number, h.client_id(), h.num_examples(), weight, h.train_loss(),
                 h.train_seconds());
  }
  cv_.SignalAll();
}

StatusOr<std::shared_ptr<const std::string>> Coordinator::FindBlob(const v1::FetchRequest& req,
                                                                   const std::string& peer,
                                                                   int64_t* fp32_size) {
  MutexLock l(&mu_);
  RETURN_IF_ERROR(SessionLocked(req.client_id(), req.session_token(), peer).status());
  ASSIGN_OR_RETURN(BlobStore::Found found, blobs_.Find(req.digest()));
  *fp32_size = found.fp32_size;
  return std::move(found.blob);
}

}  // namespace cleave
