// Buffered asynchronous aggregation (FedBuff, Nguyen et al. 2022): how much an update
// computed from an older model version counts when it is applied to a newer one.
#pragma once

#include <cstdint>
#include <string>

#include "core/names.h"

namespace cleave {

// The factor an update of staleness `s` (model versions applied since the one it was
// trained from; s >= 0) is scaled by, for `rule` (scheduler.staleness):
//   constant:   1
//   polynomial: (1 + s)^-a                     (a = scheduler.staleness_exponent)
//   hinge:      1 for s <= b, else 1 / (1 + a (s - b))   (b = scheduler.staleness_hinge)
// Updates staler than scheduler.max_staleness are refused before this is asked.
double StalenessFactor(const std::string& rule, double a, int b, int64_t s);
// The rules StalenessFactor knows (scheduler.staleness).
const NameTable& StalenessNames();

// Staleness control (scheduler.target_staleness, after DySTop's dynamic staleness
// control): what the server knows of one client's speed, from its finished tasks.
// Each task's report updates an exponential moving average (weight 1/2 on the newest):
// seconds per local step (its reported training time over the steps it was given), and
// the rest of the task's wall time on the server's clock (fetching, uploading, waiting).
// The training time is the client's word: a client that lies about it only changes the
// size of its own tasks, within [min_local_steps, train's steps].
struct ClientSpeed {
  double step_s = 0;      // 0 until a task was measured
  double overhead_s = 0;
  void Observe(int64_t steps, double train_s, double wall_s);
};

// The local steps a task should get so that its update arrives about `target` versions
// after the one it trains from, when versions are applied every `version_interval_s`
// seconds: (target x interval - overhead) / step time, within [min_steps, base_steps].
// base_steps (train's work) while either the client's speed or the interval is unknown
// (the coordinator sizes a client not yet measured by the slowest one measured).
int64_t SizedSteps(int64_t base_steps, int64_t min_steps, int target, double version_interval_s,
                   const ClientSpeed& speed);

// How many versions late an update of `steps` local steps from a client of `speed`
// arrives when versions are applied every `version_interval_s` seconds; 0 while either
// is unknown.
double PredictedStaleness(int64_t steps, double version_interval_s, const ClientSpeed& speed);

}  // namespace cleave
