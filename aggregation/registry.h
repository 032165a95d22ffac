// The strategies and robust rules a job can name, as registries (core/registry.h).
// CreateStrategy builds strategies through Strategies(); robust::Aggregate runs rules
// through RobustRules(); the job's validation (job/job.h), the errors and the docs test
// read the same tables. The built-ins are registered in aggregation/registry.cc; a
// strategy or rule of one's own is its own file plus one Add
// (tests/integration/registration_test.cc registers a strategy from the test file).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "aggregation/strategy.h"
#include "core/registry.h"

namespace cleave {

struct StrategyKind {
  // Builds the bare strategy from the job (CreateStrategy adds the wrappers: robust
  // rule, DP, EF21). Settings errors are INVALID_ARGUMENT naming the key.
  std::function<StatusOr<std::unique_ptr<Strategy>>(const StrategyJob&)> make;
  // strategy.server_lr when the job leaves it out (0.1 for the adaptive optimizers of
  // Reddi et al., 0.7 for DiLoCo's outer Nesterov step, else 1).
  double default_server_lr = 1.0;
};

// strategy.name: fedavg, fedprox, fedavgm, diloco, fedadam, fedyogi, fedadagrad.
Registry<StrategyKind>& Strategies();

namespace robust {

// What a rule sees of a round: every update flattened (all the same length), the
// clients' weights, and the rule's settings (aggregation.f, m, max_norm; m already
// defaulted to n - f) and FLTrust's server update (empty unless the rule needs one).
struct RuleInput {
  const std::vector<std::vector<float>>& updates;
  const std::vector<double>& weights;
  int f = 0;
  int m = 0;
  double max_norm = 0;
  const std::vector<float>& reference;
};

struct RuleKind {
  // FAILED_PRECONDITION unless the rule can run on n updates tolerating f attackers
  // (m: multi-Krum's pick); null: any n >= 1.
  std::function<Status(int n, int f, int m)> precondition;
  std::function<StatusOr<std::vector<float>>(const RuleInput&)> aggregate;
};

// aggregation.rule: mean, median, trimmed_mean, krum, multi_krum, bulyan, norm_bound,
// fltrust.
Registry<RuleKind>& RobustRules();

}  // namespace robust

inline NameTable StrategyNames() { return Strategies().Table(); }
inline NameTable RuleNames() { return robust::RobustRules().Table(); }

}  // namespace cleave
