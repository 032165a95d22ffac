#include "server/rounds/round_registry.h"

#include "server/modes/gossip_driver.h"
#include "server/modes/secagg_driver.h"
#include "server/modes/split_driver.h"
#include "server/modes/width_driver.h"
#include "server/options.h"
#include "server/rounds/scheduler.h"

namespace cleave {

Registry<SchedulerKind>& Schedulers() {
  static Registry<SchedulerKind>* schedulers = [] {
    auto* r = new Registry<SchedulerKind>("scheduler.mode");
    auto sync = [](RoundContext& ctx, RoundDriver& driver) -> std::unique_ptr<RoundScheduler> {
      const SplitConfig& split = ctx.config().split;
      if (split.Is(SplitMode::kSl)) return std::make_unique<TurnRounds>(ctx, driver);
      return std::make_unique<SyncRounds>(ctx, driver);
    };
    r->AddBuiltin("sync", {sync});
    r->AddBuiltin("async", {[](RoundContext& ctx, RoundDriver& driver) -> std::unique_ptr<RoundScheduler> {
                    return std::make_unique<AsyncBuffers>(ctx, driver);
                  }});
    r->AddBuiltin("gossip", {sync});
    return r;
  }();
  return *schedulers;
}

Registry<DriverKind>& RoundDrivers() {
  static Registry<DriverKind>* drivers = [] {
    auto* r = new Registry<DriverKind>("round driver");
    r->AddBuiltin("split", {[](const FederationConfig& c) { return c.split.enabled(); },
                            [](RoundContext& ctx) -> std::unique_ptr<RoundDriver> {
                              return std::make_unique<SplitDriver>(ctx);
                            }});
    r->AddBuiltin("width", {[](const FederationConfig& c) { return c.width.enabled; },
                            [](RoundContext& ctx) -> std::unique_ptr<RoundDriver> {
                              return std::make_unique<WidthDriver>(ctx);
                            }});
    r->AddBuiltin("secagg", {[](const FederationConfig& c) { return c.secure_aggregation.enabled; },
                             [](RoundContext& ctx) -> std::unique_ptr<RoundDriver> {
                               return std::make_unique<SecAggDriver>(ctx);
                             }});
    r->AddBuiltin("gossip", {[](const FederationConfig& c) { return c.scheduler.gossip(); },
                             [](RoundContext& ctx) -> std::unique_ptr<RoundDriver> {
                               return std::make_unique<GossipDriver>(ctx, ctx);
                             }});
    return r;
  }();
  return *drivers;
}

}  // namespace cleave
