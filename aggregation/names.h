// The strategies and robust rules a job can name (core/names.h). CreateStrategy and
// MakeRobustStrategy build exactly these; AggregationNamesTest checks that they do.
#pragma once

#include "core/names.h"

namespace cleave {

inline const NameTable& StrategyNames() {
  static const NameTable t{"strategy.name",
                           {"fedavg", "fedprox", "fedavgm", "diloco", "fedadam", "fedyogi",
                            "fedadagrad"}};
  return t;
}

// Strategies with an adaptive server optimizer, whose strategy.server_lr defaults to 0.1.
inline bool AdaptiveServerOptimizer(const std::string& strategy) {
  return strategy == "fedadam" || strategy == "fedyogi" || strategy == "fedadagrad";
}

inline const NameTable& RuleNames() {
  static const NameTable t{"aggregation.rule",
                           {"mean", "median", "trimmed_mean", "krum", "multi_krum", "bulyan",
                            "norm_bound", "fltrust"}};
  return t;
}

}  // namespace cleave
