// RoundMachinery: how a job's rounds run, chosen once from its config, one of the
// coordinator's components: the kind of round (the plain federated driver, or the job's
// RoundDrivers() entry, server/rounds/round_registry.h), the scheduler of its model
// versions (Schedulers() by scheduler.mode), the synchronous rounds the final
// evaluation and an edge's rounds run on (the scheduler when it runs them, else its
// own), and what the mode serves of the transport's messages (split streams, SecAgg+'s
// stage messages). Fixed once chosen: read without a lock.
#pragma once

#include <memory>

#include "core/status.h"
#include "server/rounds/round_driver.h"
#include "server/rounds/scheduler.h"

namespace cleave {

struct FederationConfig;
class RoundContext;

class RoundMachinery {
 public:
  RoundMachinery() = default;
  RoundMachinery(const RoundMachinery&) = delete;
  RoundMachinery& operator=(const RoundMachinery&) = delete;

  // Builds the job's driver and scheduler over `ctx`. INVALID_ARGUMENT for an unknown
  // scheduler.mode.
  Status Choose(const FederationConfig& cfg, RoundContext& ctx);

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
  RoundDriver plain_;
  std::unique_ptr<RoundDriver> mode_owned_;
  RoundDriver* mode_ = &plain_;
  SplitStreams* split_ = nullptr;
  SecAggDriver* secagg_ = nullptr;
  std::unique_ptr<RoundScheduler> scheduler_;
  std::unique_ptr<SyncRounds> own_rounds_;
  SyncRounds* rounds_ = nullptr;
};

}  // namespace cleave
