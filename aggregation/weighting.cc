#include "aggregation/weighting.h"

#include <algorithm>
#include <cmath>

namespace cleave {

RoundWeights::RoundWeights(const AggregationConfig& config, const std::vector<int64_t>& declared)
    : equal_(config.weighting == "equal") {
  if (equal_) {
    cap_ = 1;
    return;
  }
  if (config.max_weight_ratio > 0 && !declared.empty()) {
    std::vector<int64_t> sorted = declared;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median =
        n % 2 ? double(sorted[n / 2]) : 0.5 * (double(sorted[n / 2 - 1]) + double(sorted[n / 2]));
    const double cap = std::floor(config.max_weight_ratio * median);
    cap_ = cap >= double(INT64_MAX) ? INT64_MAX : std::max<int64_t>(1, int64_t(cap));
  }
  if (config.max_client_examples > 0) cap_ = std::min(cap_, config.max_client_examples);
}

int64_t RoundWeights::Weight(int64_t num_examples) const {
  return std::clamp<int64_t>(num_examples, 1, cap_);
}

}  // namespace cleave
