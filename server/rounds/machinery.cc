#include "server/rounds/machinery.h"

#include "server/options.h"
#include "server/rounds/round_registry.h"

namespace cleave {

Status RoundMachinery::Choose(const FederationConfig& cfg) {
  for (const std::string& name : RoundDrivers().Names()) {
    const DriverKind* kind = RoundDrivers().Find(name);
    if (!kind->applies(cfg)) continue;
    mode_owned_ = kind->make(ctx_);
    mode_ = mode_owned_.get();
    split_ = mode_->split_streams();
    secagg_ = mode_->secure_aggregation();
    break;
  }
  ASSIGN_OR_RETURN(const SchedulerKind* scheduler, Schedulers().Get(cfg.scheduler.mode));
  scheduler_ = scheduler->make(ctx_, *mode_);
  rounds_ = scheduler_->synchronous();
  if (rounds_ == nullptr) {
    own_rounds_ = std::make_unique<SyncRounds>(ctx_, *mode_);
    rounds_ = own_rounds_.get();
  }
  return absl::OkStatus();
}

}  // namespace cleave
