// RoundContext: what the coordinator's schedulers (server/rounds/scheduler.h) and round drivers
// (server/rounds/round_driver.h) may do with the round state it owns. They get this interface,
// never the coordinator. It is four interfaces, each of at most 15 methods: the run's
// fixed facts (RunFacts), the round in progress with its sessions and tasks (RoundTasks),
// a round's steps (RoundSteps: open, send, wait, close) and the model (ModelUpdates:
// accumulate, apply, commit, blobs). The coordinator implements all four.
//
// *Locked methods need mu(). WaitLocked, SendTasksLocked and ApplyLocked release it
// while they wait, send or compute; a caller must not hold iterators or references into
// the tasks or sessions across them. Accumulate and FlTrustReference run without it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "compression/quantized_set.h"
#include "core/clock.h"
#include "core/mutex.h"
#include "core/parameter_set.h"
#include "core/status.h"
#include "server/rounds/round_state.h"

namespace cleave {

class Codec;
class RoundHooks;
class RoundWeights;
class Strategy;
struct ClientUpdate;
struct FitSettings;
struct FederationConfig;
struct ModelSpec;
struct RoundMetrics;
struct RoundPlan;

// The deadline clients are told: Unix milliseconds `seconds` from now.
int64_t UnixMsIn(double seconds);

// Hex of `bytes` bytes from OpenSSL's CSPRNG: tokens and run ids must not be guessable.
std::string RandomHex(int bytes);

// The coordinator's mutex: every *Locked method of the interfaces below needs it, and
// each reaches it here, so a caller that locks mu() of any of them is seen by the
// analysis to hold it for the others.
class RoundLock {
 public:
  virtual ~RoundLock() = default;
  virtual Mutex& mu() const = 0;
};

// Fixed for the run.
class RunFacts : public virtual RoundLock {
 public:
  virtual const Clock& clock() const = 0;
  virtual const FederationConfig& config() const = 0;
  virtual Strategy& strategy() = 0;
  // compression.update's codec; null when updates are fp32.
  virtual const Codec* update_codec() const = 0;
  virtual const ModelSpec& model_spec() const = 0;
  // The frozen tensors (a LoRA model's base): never in an update nor a round's blob.
  virtual const std::vector<std::string>& frozen() const = 0;
  // A quantized base's weights (model.quantize; empty without one): never in a
  // ParameterSet, sent to clients as their own blob.
  virtual const QuantizedSet& quantized_base() const = 0;
  // The path of `name` in the run directory; "" when the run keeps none.
  virtual std::string RunPath(const std::string& name) const = 0;
};

// The run and the round in progress: its sessions and tasks.
class RoundTasks : public virtual RoundLock {
 public:
  virtual const std::string& RunIdLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // The round (async: version) being built; 0 when none.
  virtual int64_t CurrentRoundLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  virtual int64_t CommittedRoundLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  virtual bool StoppingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // What `cleave status` and the dashboard show the run doing.
  virtual void SetPhaseLocked(std::string phase) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // Client sampling's generator (checkpointed).
  virtual std::mt19937_64& RngLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // The round's bound on declared example counts.
  virtual const RoundWeights& RoundWeightsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // An edge aggregator's round: the settings its upstream gave (else null).
  virtual const FitSettings* EdgeFitLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // Connected clients that may be given a task, in sampling order (by name, then id).
  virtual std::vector<std::string> AvailableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // The session `client_id`; null once it ended.
  virtual Session* FindSessionLocked(const std::string& client_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // The tasks of the current round (async: of the versions an upload may still reach).
  virtual TaskMap& TasksLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  virtual void FailTaskLocked(const std::string& task_id, TaskRecord& t, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // Every task sent is done or failed (none assigned, none being added).
  virtual bool RoundResolvedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // Uploads being validated and added outside the lock.
  virtual int AccumulatingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
};

// A round's steps: open, send, wait, close.
class RoundSteps : public virtual RoundLock {
 public:
  // Waits for clients.min available clients: DEADLINE_EXCEEDED after
  // clients.join_timeout_s, CANCELLED when stopped.
  virtual Status AwaitClientsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // A synchronous round opens with `clients` sampled: no tasks yet, the byte counters at
  // zero, the weights bounded by their declared examples, the strategy's round begun
  // (not for an evaluation), and `driver` the round's driver.
  virtual void BeginRoundLocked(int64_t round, const std::vector<std::string>& clients,
                                RoundHooks& driver, bool evaluate_only)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // An async buffer opens for `version`: as BeginRoundLocked with the available
  // clients and `driver`, but the tasks of earlier versions stay.
  virtual void BeginBufferLocked(int64_t version, RoundHooks& driver) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // Sends each of `client_ids` its task of `round` (plan.FitFor); a task whose control
  // stream is closed fails. Releases mu() while sending.
  virtual void SendTasksLocked(int64_t round, const std::vector<std::string>& client_ids,
                               const RoundPlan& plan, int64_t deadline_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // Waits for a change until `until` (at most a poll interval), then drops silent
  // clients and stalled uploads.
  virtual void WaitLocked(Clock::time_point until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // Waits for any change, without a deadline (a short wait on CPU work, not a client).
  virtual void AwaitChangeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // Wakes every waiter (a task resolved, a stage moved on).
  virtual void Wake() = 0;
  // Waits until no upload is being added outside the lock.
  virtual void AwaitAccumulatingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // No round is open any more (current round 0, the plain driver); waiters woken.
  virtual void EndRoundLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // Cancels the closed round's late or stalled uploads and frees their buffers (releases
  // mu() meanwhile).
  virtual void ReleaseUploadsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // The round's transport bytes into `m`.
  virtual void CountRoundBytesLocked(RoundMetrics* m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
};

// The model: the strategy's sums, the step to the next model, its blobs.
class ModelUpdates : public virtual RoundLock {
 public:
  // The layout of an update (the model without personal and frozen tensors), and the
  // model itself.
  virtual const ParameterSet& UpdateLayoutLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  virtual const ParameterSet& GlobalLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;

  // Adds a result into the strategy (shard 0); without mu(), from any thread.
  virtual void Accumulate(const ClientUpdate& update) = 0;
  // FLTrust (aggregation.root_data): trains the current model on the root data with
  // `fit` and hands the change to the strategy; nothing without root data. On the round
  // thread without mu().
  virtual Status FlTrustReference(const FitSettings& fit) = 0;
  // Steps the strategy into model `round` and publishes it (mu() released meanwhile);
  // `fold` first hands the strategy what is not an upload, given the round's model in
  // the update layout. A model that is not finite is never published: ABORTED.
  virtual Status ApplyLocked(int64_t round,
                             const std::function<Status(const ParameterSet& layout)>& fold,
                             RoundMetrics* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // Round `round` is committed without a new model (gossip: the clients keep theirs).
  virtual void CommitWithoutModelLocked(int64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;

  // The blob a model (or a client part) is sent down as: fp32, or compression.broadcast.
  virtual std::string ModelBlob(const ParameterSet& model) = 0;
  // Kept all run long (a probe, a cut's frozen base).
  virtual void PinBlobLocked(const std::string& digest, std::shared_ptr<const std::string> blob)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
  // Kept until the next model version is published; `fp32_size` is what its fp32
  // encoding would take (compression ratios).
  virtual void AddBlobLocked(const std::string& digest, std::shared_ptr<const std::string> blob,
                             int64_t fp32_size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu()) = 0;
};

// Everything a scheduler or driver may do with the round state (the four above); the
// coordinator implements it.
class RoundContext : public RunFacts, public RoundTasks, public RoundSteps, public ModelUpdates {};

}  // namespace cleave
