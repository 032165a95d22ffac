// RoundScheduler: when model versions are built and from which clients' work. The
// coordinator's round thread asks it for one version at a time (NextLocked) and
// evaluates and checkpoints each; uploads and other messages ask it whether the task
// they name is still current and how an update is admitted. Implementations:
//
//   SyncRounds    synchronous rounds: sample clients, send their tasks, wait until every
//                 task is resolved or the deadline passes, aggregate. A RoundDriver
//                 (server/rounds/round_driver.h) adds secure aggregation or split learning.
//   TurnRounds    split learning's `sl`: a synchronous round whose clients take turns,
//                 each starting when the one before it is resolved.
//   AsyncBuffers  scheduler.mode: async (FedBuff): clients train continuously from the
//                 newest model; every scheduler.buffer_size updates, each scaled by its
//                 staleness, make the next version.
//
// Every method runs with the coordinator's mutex held; NextLocked and SyncRounds'
// waits release it while they wait or send. Schedulers reach the round state through
// server/rounds/round_context.h, never the coordinator.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>

#include "aggregation/staleness.h"
#include "aggregation/strategy.h"
#include "core/files.h"
#include "server/checkpoint.h"
#include "server/rounds/round_context.h"
#include "server/rounds/round_driver.h"
#include "server/rounds/selection.h"
#include "server/server.h"

namespace cleave {

class SyncRounds;

class RoundScheduler {
 public:
  virtual ~RoundScheduler() = default;

  // Builds the next model version (committed_round_ + 1) and publishes it. Errors:
  // OUT_OF_RANGE, the strategy ended the run before it; ABORTED, it failed and may be
  // tried again; CANCELLED, the server is stopping; others end the run.
  virtual StatusOr<RoundMetrics> NextLocked() = 0;
  // OK if a message (`what`) about a task given in round `round` may still be taken;
  // FAILED_PRECONDITION saying why not.
  virtual Status CheckRoundLocked(const std::string& what, int64_t round) const = 0;
  // An upload that completed: waits while no upload can be added (async: a buffer being
  // applied, or full), then whether uploads of tasks given in `round` are still added.
  virtual bool OpenForLocked(int64_t round) = 0;
  // An upload of task `t` that passed every check under the lock: the factor its values
  // are added with, or the reason it is refused (the scheduler may fail `t`).
  virtual StatusOr<float> AdmitLocked(const std::string& /*task_id*/, TaskRecord& /*t*/,
                                      const v1::UploadHeader& /*h*/) {
    return 1.0f;
  }
  // An admitted upload was refused when it was checked without the lock.
  virtual void UnadmitLocked() {}
  // The scheduler's part of a new task for session `s` (async: an id per task, local
  // steps sized to the client's speed).
  virtual void ShapeTaskLocked(const Session& /*s*/, const FitSettings& /*fit*/,
                               v1::Task* /*task*/, TaskRecord* /*rec*/) {}
  // Task `t`'s upload `h` was accepted.
  virtual void AcceptedLocked(const TaskRecord& /*t*/, const v1::UploadHeader& /*h*/) {}
  // How many of the newest model versions stay fetchable (tasks outlive versions).
  virtual int VersionsKept() const { return 1; }
  // The scheduler as synchronous rounds, when it runs them (the coordinator runs the
  // final evaluation and an edge's rounds on it); null: another kind.
  virtual SyncRounds* synchronous() { return nullptr; }
  // Whether admitted updates are recorded before they are added (Record), so that a
  // restarted server finds them (async: the open buffer's journal).
  virtual bool Records() const { return false; }
  // Records admitted update `e` durably; an error refuses the upload, nothing added.
  // Without the coordinator's lock; thread-safe.
  virtual Status Record(const BufferEntry& /*e*/) { return absl::OkStatus(); }
  // Version `version` was committed and its checkpoint written (without the lock).
  virtual void Committed(int64_t /*version*/) {}
  // With a run directory, after the checkpoint of version `committed` was loaded:
  // restores what the scheduler recorded past it (async: the open buffer's journal).
  // Called with the coordinator's mutex held, before any round.
  virtual Status Resume(const std::string& /*run_dir*/, int64_t /*committed*/) {
    return absl::OkStatus();
  }
  // Session `client_id` ended: what the scheduler kept of it goes.
  virtual void SessionEndedLocked(const std::string& /*client_id*/) {}
};

class SyncRounds : public RoundScheduler {
 public:
  SyncRounds* synchronous() override { return this; }
  // `driver` may be the plain federated one (RoundDriver itself). Unless
  // clients.selection is uniform, its selector (Selections()) picks each round's clients.
  SyncRounds(RoundContext& ctx, RoundHooks& driver);
  // The coordinator's mutex, which guards the scheduler's state.
  Mutex& mu() const ABSL_LOCK_RETURNED(ctx_.mu()) { return ctx_.mu(); }
  // The client selector (null for uniform selection): its state is checkpointed.
  ClientSelector* selector() { return selector_.get(); }

  StatusOr<RoundMetrics> NextLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    return RunLocked(/*evaluate_only=*/false);
  }
  Status CheckRoundLocked(const std::string& what, int64_t round) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  bool OpenForLocked(int64_t round) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    return round == ctx_.CurrentRoundLocked();
  }
  // The final evaluation: every connected client measures the committed model on its
  // held-out data (Task.evaluate_only); nothing is aggregated, the model stays.
  StatusOr<RoundMetrics> EvaluateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    return RunLocked(/*evaluate_only=*/true);
  }

 protected:
  // Which of the round's clients get their task first; the rest wait for NextWaveLocked.
  virtual std::vector<std::string> FirstWaveLocked(const std::vector<std::string>& clients) {
    return clients;
  }
  // Every task sent so far is resolved: sends the next ones; false when none are left.
  virtual bool NextWaveLocked(int64_t /*round*/, const RoundPlan& /*plan*/,
                              int64_t /*deadline_ms*/) {
    return false;
  }
  // Clients sampled but never sent a task (gone before their turn): failures.
  virtual int UnservedLocked(int64_t /*round*/) { return 0; }

  RoundContext& ctx_;

 private:
  StatusOr<RoundMetrics> RunLocked(bool evaluate_only) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The round's clients by strategy (or Oort) and their plan.
  RoundPlan PlanLocked(int64_t round, bool evaluate_only) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The selector's pick of k of `available` (by client name) for round `round`, as
  // session ids; called by the strategy within PlanLocked.
  ClientSampler SelectorSampler(int64_t round, const std::vector<std::string>& available)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Closes the round: stragglers fail, per-task metrics, the selector fed.
  RoundMetrics CloseLocked(int64_t round, Clock::time_point start, bool evaluate_only,
                           double* loss_sum, int64_t* weight)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());

  RoundHooks& driver_;
  RoundDriver plain_;  // an evaluation round's
  // Fixed at construction; the selector is used with the coordinator's mutex held.
  std::unique_ptr<ClientSelector> selector_;
};

class TurnRounds : public SyncRounds {
 public:
  using SyncRounds::SyncRounds;

 protected:
  std::vector<std::string> FirstWaveLocked(const std::vector<std::string>& clients) override;
  bool NextWaveLocked(int64_t round, const RoundPlan& plan, int64_t deadline_ms) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  int UnservedLocked(int64_t round) override;

 private:
  std::deque<std::string> turns_;  // clients still to take their turn
  int lost_ = 0;                   // clients gone before their turn came
};

class AsyncBuffers : public RoundScheduler {
 public:
  // `driver`: the plain federated round's, or width-scaled submodels' (WidthDriver).
  AsyncBuffers(RoundContext& ctx, RoundHooks& driver) : ctx_(ctx), driver_(driver) {}
  // The coordinator's mutex, which guards the scheduler's state.
  Mutex& mu() const ABSL_LOCK_RETURNED(ctx_.mu()) { return ctx_.mu(); }

  StatusOr<RoundMetrics> NextLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  Status CheckRoundLocked(const std::string& what, int64_t round) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  bool OpenForLocked(int64_t round) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  StatusOr<float> AdmitLocked(const std::string& task_id, TaskRecord& t,
                              const v1::UploadHeader& h) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void UnadmitLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) { --claimed_; }
  void ShapeTaskLocked(const Session& s, const FitSettings& fit, v1::Task* task,
                       TaskRecord* rec) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void AcceptedLocked(const TaskRecord& t, const v1::UploadHeader& h) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    ObserveSpeedLocked(t, h);
  }
  int VersionsKept() const override;
  bool Records() const override { return journal_[0] != nullptr; }
  Status Record(const BufferEntry& e) override;
  void Committed(int64_t version) override;
  void SessionEndedLocked(const std::string& client_id) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    speeds_.erase(client_id);
    refused_.erase(client_id);
  }

  // Opens the open buffer's journal (RUN_DIR/buffer-a.log for odd versions,
  // buffer-b.log for even ones), keeping the updates of version committed + 1's buffer,
  // which the first NextLocked adds again. DATA_LOSS naming the file if a journal is
  // unreadable.
  Status Resume(const std::string& dir, int64_t committed) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());

 private:
  // The full buffer's metrics: its updates' staleness, local steps, loss and weight.
  RoundMetrics BufferMetricsLocked(int64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Adds the journaled updates of the buffer just opened, as their uploads did.
  void ReplayLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Opens the buffer of `version` (OUT_OF_RANGE when the strategy ends the run first).
  Status OpenBufferLocked(int64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Gives tasks to idle clients, picked at random, up to scheduler.concurrency in
  // flight. With dp, a client whose update is in the open buffer waits for the next.
  // Admission (staleness control): a client whose update would arrive more than
  // scheduler.max_staleness versions late even at min_local_steps gets no task while
  // another client is admissible, and is tried again kRetryVersions versions later (its
  // speed may have changed).
  void DispatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // How many versions late `s`'s update of min_local_steps would arrive (0 while unknown
  // or with staleness control off).
  double LateLocked(const std::string& client_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // A client too slow to be admitted: true when it is due a task to be measured again
  // (kRetryVersions after it was first refused); logs the refusal once.
  bool RetryLocked(const std::string& cid, const Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  double IntervalLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // What sizes a client's tasks: its measured speed, else the slowest measured.
  ClientSpeed SpeedLocked(const std::string& client_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  const FederationConfig& cfg() const { return ctx_.config(); }
  static constexpr int64_t kRetryVersions = 10;
  // Updates the client's speed from its task's report (ClientSpeed).
  void ObserveSpeedLocked(const TaskRecord& t, const v1::UploadHeader& h)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());

  RoundContext& ctx_;
  RoundHooks& driver_;
  // Each session's measured speed, which sizes its tasks (scheduler.target_staleness).
  std::map<std::string, ClientSpeed> speeds_ ABSL_GUARDED_BY(ctx_.mu());
  // The open buffer's settings and start; applying_: it is being applied, and uploads
  // wait for the next one; claimed_: uploads claimed into it (at most buffer_size: later
  // ones wait too); task ids are numbered (a client may get several tasks while one
  // version is built).
  RoundPlan plan_ ABSL_GUARDED_BY(ctx_.mu());
  Clock::time_point start_ ABSL_GUARDED_BY(ctx_.mu());
  bool applying_ ABSL_GUARDED_BY(ctx_.mu()) = false;
  int claimed_ ABSL_GUARDED_BY(ctx_.mu()) = 0;
  int64_t task_seq_ ABSL_GUARDED_BY(ctx_.mu()) = 0;
  // Staleness control: the last 10 buffers' seconds between applied versions, and the
  // slowest speed measured (each of its terms the largest any client's reached), which
  // sizes a client's tasks until it is measured itself.
  std::deque<double> recent_intervals_ ABSL_GUARDED_BY(ctx_.mu());
  ClientSpeed slowest_ ABSL_GUARDED_BY(ctx_.mu());
  // Clients refused admission (session id): the version in which they were.
  std::map<std::string, int64_t> refused_ ABSL_GUARDED_BY(ctx_.mu());
  // The journal's two files (null without a run directory), and what OpenJournal found
  // of the buffer to resume.
  std::unique_ptr<AppendFile> journal_[2];
  std::vector<BufferEntry> found_ ABSL_GUARDED_BY(ctx_.mu());
};

}  // namespace cleave
