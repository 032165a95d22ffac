// The one JSON form of a round's metrics: each line of a run's metrics.jsonl, and each
// round of the dashboard's /api/state history (docs/configuration.md, "metrics.jsonl").
#pragma once

#include <nlohmann/json.hpp>

#include "server/server.h"

namespace cleave {

nlohmann::json RoundMetricsJson(const RoundMetrics& m);

}  // namespace cleave
