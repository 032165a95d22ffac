// Buffered asynchronous aggregation (FedBuff, Nguyen et al. 2022): how much an update
// computed from an older model version counts when it is applied to a newer one.
#pragma once

#include "core/config.h"

namespace cleave {

// The factor an update of staleness `s` (model versions applied since the one it was
// trained from; s >= 0) is scaled by, for scheduler.staleness:
//   constant:   1
//   polynomial: (1 + s)^-a                     (a = scheduler.staleness_exponent)
//   hinge:      1 for s <= b, else 1 / (1 + a (s - b))   (b = scheduler.staleness_hinge)
// Updates staler than scheduler.max_staleness are refused before this is asked.
double StalenessFactor(const SchedulerConfig& c, int64_t s);

}  // namespace cleave
