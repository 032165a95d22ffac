#include "aggregation/staleness.h"

#include <algorithm>
#include <cmath>

namespace cleave {

const NameTable& StalenessNames() {
  static const NameTable t{"scheduler.staleness", {"constant", "polynomial", "hinge"}};
  return t;
}

double StalenessFactor(const std::string& rule, double a, int b, int64_t s) {
  if (s <= 0 || rule == "constant") return 1.0;
  if (rule == "hinge") return s <= b ? 1.0 : 1.0 / (1.0 + a * static_cast<double>(s - b));
  return std::pow(1.0 + static_cast<double>(s), -a);
}

void ClientSpeed::Observe(int64_t steps, double train_s, double wall_s) {
  if (steps <= 0 || !(train_s >= 0) || !std::isfinite(train_s) || !(wall_s >= 0)) return;
  const double step = train_s / static_cast<double>(steps);
  const double overhead = std::max(0.0, wall_s - train_s);
  const bool first = step_s <= 0;
  step_s = first ? step : (step_s + step) / 2;
  overhead_s = first ? overhead : (overhead_s + overhead) / 2;
}

int64_t SizedSteps(int64_t base_steps, int64_t min_steps, int target, double version_interval_s,
                   const ClientSpeed& speed) {
  if (target <= 0 || speed.step_s <= 0 || version_interval_s <= 0) return base_steps;
  const double budget = target * version_interval_s - speed.overhead_s;
  const double steps = std::floor(budget / speed.step_s);
  const int64_t lo = std::min(min_steps, base_steps);
  if (!(steps >= static_cast<double>(lo))) return lo;  // also NaN
  if (steps >= static_cast<double>(base_steps)) return base_steps;
  return static_cast<int64_t>(steps);
}

double PredictedStaleness(int64_t steps, double version_interval_s, const ClientSpeed& speed) {
  if (speed.step_s <= 0 || version_interval_s <= 0) return 0;
  return (speed.overhead_s + static_cast<double>(steps) * speed.step_s) / version_interval_s;
}

}  // namespace cleave
