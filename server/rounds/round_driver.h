// RoundDriver: what a synchronous round does besides collecting federated updates.
// SyncRounds (server/rounds/scheduler.h) calls its driver at fixed points of every round, so
// the round loop has no branch for secure aggregation or split learning:
//
//   ChooseLocked       the round's clients are sampled: leave out those it cannot
//                      serve (split: no cut fits; gossip: no Peer address), before the
//                      round is sized (update weights, DP noise shares)
//   BeginLocked        the round started with its clients: set up the rest
//   PrepareTaskLocked  each task: the driver's part of the message and of its record
//   AwaitLocked        training: wait for the uploads, or drive the round's own stages
//   CheckUploadLocked  an upload's header: the driver's part of it (its stats)
//   TakeLocked         an upload the driver consumes whole under the lock
//   ClaimUploadLocked  an upload the driver adds itself, without the lock
//   AcceptedLocked     an upload was accepted: what the driver keeps of its report
//   CloseLocked        the round closed: the driver's metrics
//   Fold               before the strategy steps: hand it what is not an upload
//
// Asynchronous buffers (scheduler.mode: async) call the width driver's too:
// BufferOpenedLocked as each buffer opens, then PrepareTaskLocked, UploadLayoutLocked and
// ClaimUploadLocked for tasks of this and earlier versions (and for journaled uploads
// replayed after a restart), CloseLocked and Fold as the buffer is applied.
//
// Those are RoundHooks, all that schedulers and the round in progress hold of a driver.
// The base class is the plain federated round: every hook does nothing and each
// upload's delta goes to the strategy. SecAggDriver, SplitDriver, GossipDriver and
// WidthDriver are the others.
//
// ModeHooks, the other half, is all the coordinator's session code sees. Through it the
// driver of the job's mode keeps that mode's state of each session (a split
// client's profile and cut, a gossip client's measured uplink, a width client's rate):
// it prepares once before anything is served (PrepareLocked), asks for and keeps
// clients' profiles (NeedsProfile, CheckProfile, ProfileLocked), decides which sessions
// it can serve (ServesLocked), fills in what the operator sees of them
// (DescribeClientLocked) and forgets them (SessionEndedLocked).
//
// Messages that belong to one mode reach the driver that serves them through what it
// returns here, never a cast: secure_aggregation() takes SecAgg+'s stage messages,
// split_streams() split learning's streams (and pipelines', whose last device streams).
//
// Drivers reach the round through server/rounds/round_context.h, never the coordinator.
// Threads: *Locked hooks run with the coordinator's mutex held (AwaitLocked releases
// it while it sends); the functions ClaimUploadLocked returns and Fold run without it.
// A driver's round state is guarded by the coordinator's mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/clock.h"
#include "core/mutex.h"
#include "core/parameter_set.h"
#include "core/status.h"

namespace cleave {

namespace v1 {
class Profile;
class SplitOpen;
class Task;
class UploadHeader;
}  // namespace v1

class Model;
class SecAggDriver;
struct ClientHealth;
struct FitSettings;
struct ModelSpec;
struct RoundMetrics;
struct SplitStreamTask;
struct TaskRecord;

// Split learning's activation streams (server/transport/split_stream.h), served by the driver of
// a split mode (RoundDriver::split_streams()). The transport counts what crosses the
// cut without the lock.
class SplitStreams {
 public:
  virtual ~SplitStreams() = default;
  virtual Mutex& mu() const = 0;  // the coordinator's
  // Before anything is served: the server's part built from `spec`, its stages of
  // `model` profiled.
  virtual Status InitLocked(const ModelSpec& spec, const Model& model) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // A SplitOpen for a split task of the current round; one stream per task.
  virtual StatusOr<SplitStreamTask> OpenLocked(const v1::SplitOpen& open) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // A split stream of the current round failed (bad message, lost connection).
  virtual void EndedLocked(const SplitStreamTask& task, const Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  virtual void CountUp(int64_t bytes) = 0;
  virtual void CountDown(int64_t bytes) = 0;
  virtual void CountLabels(int64_t labels) = 0;
};

// What a round calls (the round's hooks above): all a scheduler and the round in progress
// hold of a driver.
class RoundHooks {
 public:
  virtual ~RoundHooks() = default;

  // Round `round`'s `clients` are sampled, to train with `fit`: leaves out those it
  // cannot serve, and sets up what depends on who takes part. The clients left are the
  // round's: it is sized from them next. An error: the round does not start.
  virtual Status ChooseLocked(int64_t /*round*/, const FitSettings& /*fit*/, std::vector<std::string>* /*clients*/) {
    return absl::OkStatus();
  }
  // Round `round` started with `clients` (sized: RoundContext::RoundWeightsLocked holds
  // their weights). An error fails the round before any task is sent.
  virtual Status BeginLocked(int64_t /*round*/, const FitSettings& /*fit*/,
                             const std::vector<std::string>& /*clients*/) {
    return absl::OkStatus();
  }
  // Adds the driver's part to `task` and `rec` (the model to fetch, the upload's codec
  // and size) after the coordinator filled in the common part.
  virtual void PrepareTaskLocked(v1::Task* /*task*/, TaskRecord* /*rec*/) {}
  // nullopt: the scheduler waits for the uploads itself. Otherwise the driver has run
  // the round's training and stages up to `deadline` (masked inputs are due by then),
  // and returns how they ended; an error fails the round after it closes.
  virtual std::optional<Status> AwaitLocked(Clock::time_point /*deadline*/) {
    return std::nullopt;
  }
  // The driver's checks of the header of an upload of `t` (the stats it reports).
  virtual Status CheckUploadLocked(const TaskRecord& /*t*/, const v1::UploadHeader& /*h*/) {
    return absl::OkStatus();
  }
  // The layout the upload of `t` has (split: its client part); null: the update layout.
  virtual const ParameterSet* UploadLayoutLocked(const TaskRecord& /*t*/) { return nullptr; }
  // An upload of `t` that passed the coordinator's checks: true, with *status, if the
  // driver consumed it whole (a masked secure-aggregation input); false to go on.
  virtual bool TakeLocked(const v1::UploadHeader& /*h*/, const std::string& /*payload*/,
                          const TaskRecord& /*t*/, Status* /*status*/) {
    return false;
  }
  // What adds an upload of `t` (its validated views, its weight) without the lock, if
  // the driver adds it itself (split: the client's trained part into the split round);
  // null: the strategy accumulates it.
  using AddUpload = std::function<Status(const std::vector<TensorView>& delta, int64_t weight)>;
  virtual AddUpload ClaimUploadLocked(const TaskRecord& /*t*/) { return nullptr; }
  // The upload `h` of `t` was accepted.
  virtual void AcceptedLocked(const TaskRecord& /*t*/, const v1::UploadHeader& /*h*/) {}
  // The task `t` failed, or its client left the federation.
  virtual void TaskFailedLocked(const TaskRecord& /*t*/) {}
  virtual void ClientLeftLocked(const std::string& /*client_id*/) {}
  // The round closed (its tasks resolved or failed): the driver's part of `m`.
  virtual void CloseLocked(int64_t /*round*/, RoundMetrics* /*m*/) {}
  // Hands the strategy what the round made that is not an upload (the unmasked sum; a
  // split round's mean model), given `start`, the round's model in the update layout,
  // and `weight`, the examples of the accepted results. On the round thread, after
  // CloseLocked, before the strategy steps.
  virtual Status Fold(const ParameterSet& /*start*/, int64_t /*weight*/) {
    return absl::OkStatus();
  }
  // scheduler.mode: async: the buffer of model version `version` opened (tasks of earlier
  // versions stay); an error fails the buffer.
  virtual Status BufferOpenedLocked(int64_t /*version*/) { return absl::OkStatus(); }
  // Whether a round makes a new model on the server (false: gossip rounds, where the
  // clients' models never reach it; the round is committed as it closes).
  virtual bool Aggregates() const { return true; }
};

// The mode's side of a driver: its state of each session, the profiles it asks for,
// what its rounds do and serve. All the coordinator's session code sees of it.
class ModeHooks {
 public:
  virtual ~ModeHooks() = default;
  // The mode's driver: the run's model is loaded and nothing is served yet (the process
  // is quiet): one-time work, such as measuring what its models cost.
  virtual Status PrepareLocked() { return absl::OkStatus(); }
  // The mode's driver: whether clients must send a Profile (what they measured of the
  // model, their link and memory; Welcome.profile_batch_size) before they take part
  // (split with cut: auto, width.assign: profile); its checks; keeping a checked one.
  virtual bool NeedsProfile() const { return false; }
  virtual Status CheckProfile(const v1::Profile& /*p*/) const { return absl::OkStatus(); }
  virtual void ProfileLocked(const std::string& /*client_id*/, const v1::Profile& /*p*/) {}
  // The mode's driver: whether session `client_id` can be given tasks yet (split with
  // cut: auto: once it sent a Profile).
  virtual bool ServesLocked(const std::string& /*client_id*/) const { return true; }
  // The mode's driver: what the operator sees of the session's mode state.
  virtual void DescribeClientLocked(const std::string& /*client_id*/, ClientHealth* /*c*/) const {}
  // The mode's driver: the session ended; its state goes.
  virtual void SessionEndedLocked(const std::string& /*client_id*/) {}
  // Whether clients report federated evaluations of the server's model in this kind of
  // round (the final evaluation is skipped otherwise).
  virtual bool ClientsEvaluate() const { return true; }
  // The last round's weight of each element in the update layout (width-scaled
  // submodels: the examples of the devices that held it); empty when every element has
  // the round's weight. An edge aggregator hands it up with its mean.
  virtual ParameterSet ElementWeights() const { return ParameterSet(); }
  // The secure aggregation the driver's rounds run, which takes the clients' stage
  // messages: the driver itself, or one it composes (a pipeline's, width's); null: none.
  virtual SecAggDriver* secure_aggregation() { return nullptr; }
  // The split streams the driver's rounds serve; null: none.
  virtual SplitStreams* split_streams() { return nullptr; }
};

// A kind of round (RoundDrivers(), server/rounds/round_registry.h): both of the above.
// The base class itself is the plain federated round.
class RoundDriver : public RoundHooks, public ModeHooks {};

}  // namespace cleave
