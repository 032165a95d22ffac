// RoundMachinery: how a job's rounds run and the round in progress, one of the
// coordinator's components. Chosen once from the job's config: the kind of round (the
// plain federated driver, or the job's RoundDrivers() entry,
// server/rounds/round_registry.h), the scheduler of its model versions (Schedulers() by
// scheduler.mode), the synchronous rounds the final evaluation and an edge's rounds run
// on (the scheduler when it runs them, else its own), and what the mode serves of the
// transport's messages (split streams, SecAgg+'s stage messages); these are fixed once
// chosen and read without a lock. The round they run (CurrentRound: its number, tasks,
// weights, uploads in flight and driver) is theirs too, guarded by the round context's
// mutex; the context's BeginRoundLocked, BeginBufferLocked and EndRoundLocked begin and
// end it.
#pragma once

#include <memory>

#include "core/mutex.h"
#include "core/status.h"
#include "server/rounds/round_context.h"
#include "server/rounds/round_driver.h"
#include "server/rounds/round_state.h"
#include "server/rounds/scheduler.h"

namespace cleave {

struct FederationConfig;

class RoundMachinery {
 public:
  // Over `ctx`, which outlives it; no round yet (the plain driver's).
  explicit RoundMachinery(RoundContext& ctx) : ctx_(ctx) { round_.driver = &plain_; }
  RoundMachinery(const RoundMachinery&) = delete;
  RoundMachinery& operator=(const RoundMachinery&) = delete;

  // Builds the job's driver and scheduler. INVALID_ARGUMENT for an unknown
  // scheduler.mode.
  Status Choose(const FederationConfig& cfg);

  // The mutex that guards the round in progress: the round context's.
  Mutex& mu() const ABSL_LOCK_RETURNED(ctx_.mu()) { return ctx_.mu(); }
  CurrentRound& round() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) { return round_; }
  const CurrentRound& round() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) { return round_; }

  // The plain federated round: between rounds, and the driver of an evaluation round.
  RoundDriver& plain() { return plain_; }
  // The job's kind of round (the plain one unless a RoundDrivers() entry applies): its
  // mode's side, which the coordinator's session code calls. Its round hooks are the
  // scheduler's.
  ModeHooks& mode() const { return *mode_; }
  RoundScheduler& scheduler() const { return *scheduler_; }
  SyncRounds& rounds() const { return *rounds_; }
  // The mode's endpoints for messages that belong to it; null when it has none.
  SplitStreams* split() const { return split_; }
  SecAggDriver* secagg() const { return secagg_; }

 private:
  RoundContext& ctx_;
  RoundDriver plain_;
  std::unique_ptr<RoundDriver> mode_owned_;
  RoundDriver* mode_ = &plain_;
  SplitStreams* split_ = nullptr;
  SecAggDriver* secagg_ = nullptr;
  std::unique_ptr<RoundScheduler> scheduler_;
  std::unique_ptr<SyncRounds> own_rounds_;
  SyncRounds* rounds_ = nullptr;
  CurrentRound round_ ABSL_GUARDED_BY(ctx_.mu());  // its driver: the plain one between rounds
};

}  // namespace cleave
