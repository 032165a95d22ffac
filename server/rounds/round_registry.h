// How rounds run, by registration: the kind of round (a RoundDriver) and the scheduler
// that builds model versions from rounds (a RoundScheduler), each a name-keyed factory
// table (core/registry.h). The coordinator builds the run's driver and scheduler from
// them in Init; a scheduler or driver of one's own is its own file plus one line:
//
//   Schedulers().Add("pairs", {[](RoundContext& ctx, RoundDriver& driver) {
//     return std::make_unique<PairRounds>(ctx, driver);
//   }});
//
// and a job selects it with scheduler.mode: pairs (the job layer checks the name).
#pragma once

#include <functional>
#include <memory>

#include "core/registry.h"

namespace cleave {

class RoundContext;    // server/rounds/round_context.h
class RoundDriver;     // server/rounds/round_driver.h
class RoundScheduler;  // server/rounds/scheduler.h
struct FederationConfig;

// scheduler.mode: sync (SyncRounds; split.mode sl's clients take turns: TurnRounds),
// async (AsyncBuffers, FedBuff), gossip (synchronous rounds of the gossip driver).
struct SchedulerKind {
  // The run's scheduler over `driver`, the job's kind of round.
  std::function<std::unique_ptr<RoundScheduler>(RoundContext& ctx, RoundDriver& driver)> make;
};
Registry<SchedulerKind>& Schedulers();
inline NameTable SchedulerModeNames() { return Schedulers().Table(); }

// The kinds of round besides plain federated rounds: split (split.mode set),
// secagg (secure_aggregation.enabled), gossip (scheduler.mode: gossip). The job's is the
// one whose `applies` holds (job/rules.cc lets at most one); none: plain rounds.
struct DriverKind {
  std::function<bool(const FederationConfig& job)> applies;
  std::function<std::unique_ptr<RoundDriver>(RoundContext& ctx)> make;
};
Registry<DriverKind>& RoundDrivers();

}  // namespace cleave
