// Buffered asynchronous aggregation (AsyncBuffers, scheduler.mode: async, after FedBuff).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "aggregation/staleness.h"
#include "aggregation/strategy.h"
#include "compression/codec.h"
#include "models/model.h"
#include "server/options.h"
#include "server/rounds/scheduler.h"
#include "server/server.h"

namespace cleave {

Status AsyncBuffers::CheckRoundLocked(const std::string& what, int64_t round) const {
  if (ctx_.CurrentRoundLocked() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " for round ", round, ": no buffer is open"));
  }
  // Tasks outlive the version they were given in, up to scheduler.max_staleness.
  if (round > ctx_.CurrentRoundLocked()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " for model version ", round - 1, ", a future one: the newest is ",
        ctx_.CurrentRoundLocked() - 1));
  }
  if (ctx_.CurrentRoundLocked() - round > cfg().scheduler.max_staleness) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " against model version ", round - 1, ", ", ctx_.CurrentRoundLocked() - round,
        " versions stale: scheduler.max_staleness is ", cfg().scheduler.max_staleness));
  }
  return absl::OkStatus();
}

bool AsyncBuffers::OpenForLocked(int64_t round) {
  // A buffer being applied, or full with uploads still being added: this one goes into
  // the next (a short wait: CPU work, not a client).
  while (!ctx_.StoppingLocked() && ctx_.CurrentRoundLocked() != 0 &&
         (applying_ || claimed_ >= cfg().scheduler.buffer_size)) {
    ctx_.AwaitChangeLocked();
  }
  return ctx_.CurrentRoundLocked() != 0 && round <= ctx_.CurrentRoundLocked();
}

StatusOr<float> AsyncBuffers::AdmitLocked(const std::string& task_id, TaskRecord& t,
                                          const v1::UploadHeader& h) {
  const int64_t staleness = ctx_.CurrentRoundLocked() - t.round;
  if (staleness > cfg().scheduler.max_staleness) {
    ObserveSpeedLocked(t, h);  // so that its next task is sized to arrive in time
    ctx_.FailTaskLocked(task_id, t, "too stale");
    ctx_.Wake();
    return absl::FailedPreconditionError(absl::StrCat(
        "update against model version ", t.round - 1, " is ", staleness,
        " versions stale: scheduler.max_staleness is ", cfg().scheduler.max_staleness));
  }
  t.staleness = staleness;
  ++claimed_;
  const SchedulerConfig& sc = cfg().scheduler;
  return static_cast<float>(
      StalenessFactor(sc.staleness, sc.staleness_exponent, sc.staleness_hinge, staleness));
}

int AsyncBuffers::VersionsKept() const { return cfg().scheduler.max_staleness + 1; }

void AsyncBuffers::ShapeTaskLocked(const Session& s, const FitSettings& fit, v1::Task* task,
                                   TaskRecord* rec) {
  // A client may get several tasks while one version is built.
  task->set_task_id(absl::StrCat("r", rec->round, "-", rec->client_id, "-", ++task_seq_));
  rec->sent = ctx_.clock().Now();
  rec->deadline = rec->sent + Seconds(cfg().clients.round_deadline_s);
  // Staleness control: as many steps as the client can do while about target_staleness
  // versions are applied. A client not measured yet is taken to be as slow as the
  // slowest one measured (train's work while none is).
  const int64_t base = TaskSteps(fit.local_steps, fit.local_epochs,
                                 std::max<int64_t>(1, s.num_examples), fit.batch_size);
  rec->steps = SizedSteps(base, cfg().scheduler.min_local_steps,
                          cfg().scheduler.target_staleness, IntervalLocked(),
                          SpeedLocked(s.id));
  if (rec->steps != base) task->mutable_train()->set_local_steps(rec->steps);
}

double AsyncBuffers::IntervalLocked() const {
  double interval_s = 0;  // the mean of the last buffers'
  for (double b : recent_intervals_) interval_s += b / recent_intervals_.size();
  return interval_s;
}

ClientSpeed AsyncBuffers::SpeedLocked(const std::string& client_id) const {
  auto it = speeds_.find(client_id);
  return it != speeds_.end() && it->second.step_s > 0 ? it->second : slowest_;
}

double AsyncBuffers::LateLocked(const std::string& client_id) const {
  const auto& c = cfg().scheduler;
  if (c.target_staleness <= 0) return 0;  // staleness control is off
  auto it = speeds_.find(client_id);
  return PredictedStaleness(c.min_local_steps, IntervalLocked(),
                            it != speeds_.end() ? it->second : ClientSpeed());
}

bool AsyncBuffers::RetryLocked(const std::string& cid, const Session& s) {
  auto [it, first] = refused_.emplace(cid, ctx_.CurrentRoundLocked());
  if (first) {
    spdlog::warn("client {} ({}) would be {:.1f} versions late even at "
                 "scheduler.min_local_steps={}; no task for it while faster clients train "
                 "(tried again in {} versions)",
                 cid, s.name, LateLocked(cid), cfg().scheduler.min_local_steps, kRetryVersions);
    return false;
  }
  if (ctx_.CurrentRoundLocked() - it->second < kRetryVersions) return false;
  it->second = ctx_.CurrentRoundLocked();  // one task, to measure it again
  return true;
}

void AsyncBuffers::ObserveSpeedLocked(const TaskRecord& t, const v1::UploadHeader& h) {
  if (!ctx_.FindSessionLocked(t.client_id)) return;
  const double wall_s = std::chrono::duration<double>(ctx_.clock().Now() - t.sent).count();
  ClientSpeed& speed = speeds_[t.client_id];
  speed.Observe(t.steps, h.train_seconds(), wall_s);
  slowest_.step_s = std::max(slowest_.step_s, speed.step_s);
  slowest_.overhead_s = std::max(slowest_.overhead_s, speed.overhead_s);
}

Status AsyncBuffers::OpenBufferLocked(int64_t version) {
  RoundPlan plan = ctx_.strategy().ConfigureBuffer(version);
  if (!plan.stop_reason.empty()) return absl::OutOfRangeError(plan.stop_reason);
  plan_ = std::move(plan);
  ctx_.BeginBufferLocked(version, driver_);
  RETURN_IF_ERROR(driver_.BufferOpenedLocked(version));
  claimed_ = 0;
  applying_ = false;
  start_ = ctx_.clock().Now();
  // Finished tasks are kept while an upload of theirs could still arrive (a retried
  // upload is a duplicate, not an unknown task); a task given in version r is refused
  // as too stale once r < version - max_staleness.
  const int64_t max_staleness = cfg().scheduler.max_staleness;
  for (auto it = ctx_.TasksLocked().begin(); it != ctx_.TasksLocked().end();) {
    const bool finished =
        it->second.state == TaskState::kDone || it->second.state == TaskState::kFailed;
    if (finished && it->second.round < version - max_staleness) {
      it = ctx_.TasksLocked().erase(it);
    } else {
      ++it;
    }
  }
  // Tasks that can no longer be accepted fail now, so that their clients get new work.
  for (auto& [id, t] : ctx_.TasksLocked()) {
    if (t.state == TaskState::kAssigned && version - t.round > max_staleness) {
      ctx_.FailTaskLocked(id, t, absl::StrCat("too stale: more than scheduler.max_staleness=",
                                            max_staleness,
                                            " versions were applied since it was given"));
    }
  }
  ctx_.Wake();  // uploads waiting for a buffer
  return absl::OkStatus();
}

void AsyncBuffers::DispatchLocked() {
  const int cap = cfg().scheduler.concurrency > 0 ? cfg().scheduler.concurrency : INT_MAX;
  // A client's updates in one buffer are bounded (a fast or flooding client cannot fill
  // it alone); with dp at one (the accounting's premise). A client has one task in flight
  // at a time, given only while it is under the bound, so no buffer gets more.
  const bool dp = cfg().dp.enabled;
  const int per_client =
      dp ? 1
         : static_cast<int>(std::ceil(cfg().scheduler.max_client_share * cfg().scheduler.buffer_size - 1e-9));
  std::set<std::string> busy;              // clients with a task in flight
  std::map<std::string, int> in_buffer;    // clients' updates in the open buffer
  for (const auto& [id, t] : ctx_.TasksLocked()) {
    if (t.state == TaskState::kAssigned || t.state == TaskState::kAccumulating) {
      busy.insert(t.client_id);
    } else if (t.state == TaskState::kDone && t.resolved_in == ctx_.CurrentRoundLocked()) {
      ++in_buffer[t.client_id];
    }
  }
  const int free = cap - static_cast<int>(busy.size());
  if (free <= 0) return;
  std::vector<std::string> idle, too_slow, at_bound;
  bool any_admissible = false;  // some client, idle or training, is fast enough
  const int64_t max_late = cfg().scheduler.max_staleness;
  for (const auto& cid : ctx_.AvailableLocked()) {
    const bool admissible = LateLocked(cid) <= max_late;
    any_admissible |= admissible;
    if (busy.count(cid)) continue;
    if (auto n = in_buffer.find(cid); n != in_buffer.end() && n->second >= per_client) {
      at_bound.push_back(cid);
      continue;
    }
    if (admissible) {
      refused_.erase(cid);
      idle.push_back(cid);
    } else {
      too_slow.push_back(cid);
    }
  }
  for (const auto& cid : too_slow) {
    // With no faster client the slow ones train (late updates beat none); else one gets
    // a task now and then, to be measured again.
    if (!any_admissible || RetryLocked(cid, *ctx_.FindSessionLocked(cid))) idle.push_back(cid);
  }
  // Without dp the bound gives way when nobody else trains or can (fewer clients than
  // the buffer needs at the bound): the buffer still fills.
  if (idle.empty() && busy.empty() && !dp) idle = std::move(at_bound);
  if (idle.empty()) return;
  const int k = std::min<int>(free, idle.size());
  for (int i = 0; i < k; ++i) {  // the first k of a seeded shuffle
    std::uniform_int_distribution<size_t> pick(i, idle.size() - 1);
    std::swap(idle[i], idle[pick(ctx_.RngLocked())]);
  }
  idle.resize(k);
  ctx_.SendTasksLocked(ctx_.CurrentRoundLocked(), idle, plan_,
                     UnixMsIn(cfg().clients.round_deadline_s));
}

RoundMetrics AsyncBuffers::BufferMetricsLocked(int64_t round) {
  RoundMetrics m;
  m.round = round;
  AsyncMetrics& am = m.async.emplace();
  double loss_sum = 0;
  int64_t weight = 0;
  for (const auto& [id, t] : ctx_.TasksLocked()) {
    if (t.resolved_in != round) continue;
    if (t.state == TaskState::kDone) {
      am.local_steps_min = m.participants ? std::min(am.local_steps_min, t.steps) : t.steps;
      am.local_steps_max = std::max(am.local_steps_max, t.steps);
      am.local_steps_mean += static_cast<double>(t.steps);
      ++m.participants;
      ++am.staleness[t.staleness];
      loss_sum += t.train_loss * t.num_examples;
      weight += t.num_examples;
    } else if (t.state == TaskState::kFailed) {
      ++m.failures;
    }
  }
  m.train_loss = weight ? loss_sum / weight : 0;
  if (m.participants) am.local_steps_mean /= m.participants;
  m.examples = weight;
  return m;
}

StatusOr<RoundMetrics> AsyncBuffers::NextLocked() {
  const int64_t round = ctx_.CommittedRoundLocked() + 1;
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    return static_cast<int>(ctx_.AvailableLocked().size()) >= cfg().clients.min_clients;
  };
  auto in_flight = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    for (const auto& [id, t] : ctx_.TasksLocked()) {
      if (t.state == TaskState::kAssigned || t.state == TaskState::kAccumulating) return true;
    }
    return false;
  };
  // The first buffer of a run (or after a failed one) waits for clients.min; later ones
  // opened as the one before was applied.
  if (ctx_.CurrentRoundLocked() != round) {
    RETURN_IF_ERROR(ctx_.AwaitClientsLocked());
    RETURN_IF_ERROR(OpenBufferLocked(round));
    ReplayLocked();  // a restarted server's buffer, as far as it was filled
  }
  ctx_.SetPhaseLocked("training (async)");
  const int k = cfg().scheduler.buffer_size;
  auto short_since = ctx_.clock().Now();  // when the federation last had clients.min
  while (!ctx_.StoppingLocked() && !(claimed_ >= k && ctx_.AccumulatingLocked() == 0)) {
    const auto now = ctx_.clock().Now();
    auto wake = now + Seconds(cfg().clients.round_deadline_s);
    for (auto& [id, t] : ctx_.TasksLocked()) {
      if (t.state != TaskState::kAssigned) continue;
      if (now >= t.deadline) {
        ctx_.FailTaskLocked(id, t, "missed its deadline");
      } else {
        wake = std::min(wake, t.deadline);
      }
    }
    DispatchLocked();
    if (enough() || in_flight()) {
      short_since = now;
    } else if (now > short_since + Seconds(cfg().clients.join_timeout_s)) {
      ctx_.EndRoundLocked();
      ctx_.Wake();
      return absl::DeadlineExceededError(absl::StrCat(
          "version ", round, ": fewer than clients.min=", cfg().clients.min_clients,
          " clients connected for ", cfg().clients.join_timeout_s, "s"));
    } else {
      wake = std::min(wake, short_since + Seconds(cfg().clients.join_timeout_s));
    }
    ctx_.WaitLocked(wake);
  }
  if (ctx_.StoppingLocked()) {
    ctx_.EndRoundLocked();
    ctx_.Wake();
    return absl::CancelledError("stopped");
  }
  // The buffer is full and nothing is being added: apply it. Uploads wait meanwhile.
  applying_ = true;
  RoundMetrics m = BufferMetricsLocked(round);
  driver_.CloseLocked(round, &m);
  ctx_.CountRoundBytesLocked(&m);
  const int64_t weight = m.examples;
  if (Status s = ctx_.ApplyLocked(round, [&](const ParameterSet& layout) { return driver_.Fold(layout, weight); }, &m);
      !s.ok()) {
    // The buffer is dropped; the next call opens it again (Run retries).
    ctx_.EndRoundLocked();
    applying_ = false;
    ctx_.Wake();
    return s;
  }
  m.wall_s = std::chrono::duration<double>(ctx_.clock().Now() - start_).count();
  // The buffer opened when the version before was applied: wall_s is the interval.
  // Staleness control uses the mean of the last 10 (single buffers' vary several-fold).
  recent_intervals_.push_back(m.wall_s);
  if (recent_intervals_.size() > 10) recent_intervals_.pop_front();
  if (round < cfg().run.rounds) {
    // The next buffer opens before this version is evaluated and checkpointed. If the
    // strategy ends the run first (a privacy budget), none opens and the next call says
    // why.
    if (!OpenBufferLocked(round + 1).ok()) ctx_.EndRoundLocked();
  } else {
    ctx_.EndRoundLocked();
  }
  applying_ = false;
  ctx_.Wake();
  return m;
}

Status AsyncBuffers::Resume(const std::string& dir, int64_t committed) {
  const int64_t next = committed + 1;
  for (int parity : {0, 1}) {
    const std::string path = dir + (parity ? "/buffer-a.log" : "/buffer-b.log");
    std::string bytes;
    ASSIGN_OR_RETURN(journal_[parity], AppendFile::Open(path, &bytes));
    size_t complete = 0;
    auto entries = DecodeBufferJournal(bytes, &complete);
    if (!entries.ok()) {
      return Status(entries.status().code(),
                    absl::StrCat(path, ": ", entries.status().message(),
                                 " (remove it to start the open buffer afresh)"));
    }
    if (complete < bytes.size()) {
      spdlog::warn("{}: dropping a record cut short at byte {} (its upload was never "
                   "acknowledged)", path, complete);
    }
    for (auto& e : *entries) {
      if (e.version == next) found_.push_back(std::move(e));
    }
    // What is not the next version's buffer was applied and checkpointed already.
    RETURN_IF_ERROR(journal_[parity]->Truncate(0));
  }
  for (const BufferEntry& e : found_) {
    RETURN_IF_ERROR(journal_[e.version % 2]->Append(EncodeBufferRecord(e)));
  }
  if (!found_.empty()) {
    spdlog::info("resuming version {}'s buffer with {} journaled updates", next, found_.size());
  }
  return absl::OkStatus();
}

Status AsyncBuffers::Record(const BufferEntry& e) {
  return journal_[e.version % 2]->Append(EncodeBufferRecord(e));
}

void AsyncBuffers::Committed(int64_t version) {
  if (!journal_[0]) return;
  // Its checkpoint holds what the journal did; the version after next goes there next.
  if (Status s = journal_[version % 2]->Truncate(0); !s.ok()) {
    spdlog::warn("buffer journal: {}", std::string(s.message()));
  }
}

void AsyncBuffers::ReplayLocked() {
  std::vector<BufferEntry> entries = std::move(found_);
  found_.clear();
  int n = 0;
  for (const BufferEntry& e : entries) {
    if (e.version != ctx_.CurrentRoundLocked()) continue;
    // The task it answered, done: it counts in the buffer's metrics and fills its slot.
    TaskRecord t;
    t.id = absl::StrCat("journal-", e.version, "-", n);
    t.client_id = absl::StrCat("journal:", e.client_name);
    t.state = TaskState::kDone;
    t.round = e.task_round;
    t.resolved_in = e.version;
    t.staleness = e.staleness;
    t.train_loss = e.train_loss;
    t.num_examples = e.weight;
    t.steps = e.steps;
    t.width = e.width;
    t.edge = e.edge;
    // The checks its upload passed, again: the journal is disk input. A submodel's is in
    // its own layout, and the driver adds it.
    const ParameterSet* own = driver_.UploadLayoutLocked(t);
    const ParameterSet& layout = own ? *own : ctx_.UpdateLayoutLocked();
    StatusOr<std::vector<TensorView>> views =
        e.codec == "fp32" ? ParseParameterSet(e.payload, cfg().server.max_model_elements)
        : ctx_.update_codec() && e.codec == cfg().compression.update
            ? ViewEncodedTensors(*ctx_.update_codec(), e.payload, layout)
            : StatusOr<std::vector<TensorView>>(absl::InvalidArgumentError(
                  absl::StrCat("codec '", e.codec, "' is not this run's")));
    Status ok = views.status();
    if (ok.ok()) ok = CheckViews(layout, *views, static_cast<float>(cfg().server.max_update_abs));
    if (!ok.ok()) {
      spdlog::warn("buffer journal: an update of {} not added again: {}", e.client_name,
                   std::string(ok.message()));
      continue;
    }
    for (auto& v : *views) v.scale = e.scale;
    if (RoundHooks::AddUpload add = driver_.ClaimUploadLocked(t)) {
      if (Status s = add(*views, e.weight); !s.ok()) {
        spdlog::warn("buffer journal: an update of {} not added again: {}", e.client_name, std::string(s.message()));
        continue;
      }
    } else {
      ClientUpdate u;
      u.client_name = e.client_name;
      u.base_version = e.task_round - 1;
      u.staleness = e.staleness;
      u.delta = *std::move(views);
      u.weight = e.weight;
      u.train_loss = e.train_loss;
      ctx_.Accumulate(u);
    }
    ++n;
    ctx_.TasksLocked()[t.id] = std::move(t);
    ++claimed_;
  }
  if (n > 0) ctx_.Wake();
}

}  // namespace cleave
