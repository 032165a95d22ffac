#include "aggregation/staleness.h"

#include <cmath>

namespace cleave {

double StalenessFactor(const SchedulerConfig& c, int64_t s) {
  if (s <= 0 || c.staleness == "constant") return 1.0;
  const double a = c.staleness_exponent;
  if (c.staleness == "hinge") {
    return s <= c.staleness_hinge ? 1.0 : 1.0 / (1.0 + a * static_cast<double>(s - c.staleness_hinge));
  }
  return std::pow(1.0 + static_cast<double>(s), -a);
}

}  // namespace cleave
