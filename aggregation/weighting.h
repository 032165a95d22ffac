// How much one client's update may weigh in a round. A client declares its example
// count (at Join and in each upload); nothing on the server can check it, so a device
// that declares 10^12 examples would otherwise own FedAvg's weighted mean. The server
// bounds every declared count before any strategy, robust rule, DP wrapper, split round
// or secure aggregation sees it (docs/security.md, "What a hostile enrolled device can and cannot do").
//
// Policy (aggregation.weighting, aggregation.max_weight_ratio,
// aggregation.max_client_examples):
//  - equal: every update weighs 1.
//  - examples: an update weighs its declared count, capped at max_weight_ratio times the
//    median of the counts the round's sampled clients declared at Join (a minority of
//    liars cannot move a median far), and at max_client_examples when that is set.
// Thread-compatible value type.
#pragma once

#include <cstdint>
#include <vector>

#include "aggregation/options.h"

namespace cleave {

class RoundWeights {
 public:
  // `declared`: the example counts the round's sampled clients declared at Join.
  RoundWeights(const AggregationConfig& config, const std::vector<int64_t>& declared);
  // No policy: weights are the declared counts (tests, and before the first round).
  RoundWeights() = default;

  // The weight of an update that declares `num_examples` (>= 1): in [1, cap()].
  int64_t Weight(int64_t num_examples) const;
  // The largest weight any update can have this round.
  int64_t cap() const { return cap_; }
  bool equal() const { return equal_; }

 private:
  bool equal_ = false;
  int64_t cap_ = INT64_MAX;
};

}  // namespace cleave
