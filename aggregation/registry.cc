// The built-in strategies and robust rules: one line each.
#include "aggregation/registry.h"

#include "aggregation/fedavg.h"
#include "aggregation/robust.h"

namespace cleave {
namespace {

StrategyKind Family(const std::string& name, ServerRule rule, double default_server_lr) {
  return {[name, rule](const StrategyJob& c) -> StatusOr<std::unique_ptr<Strategy>> {
            return MakeFedAvgFamily(name, rule, c);
          },
          default_server_lr};
}

}  // namespace

Registry<StrategyKind>& Strategies() {
  static Registry<StrategyKind>* r = [] {
    auto* r = new Registry<StrategyKind>("strategy.name");
    auto family = [r](const std::string& name, ServerRule rule, double default_server_lr) {
      r->AddBuiltin(name, Family(name, rule, default_server_lr));
    };
    family("fedavg", ServerRule::kSgd, 1.0);
    family("fedprox", ServerRule::kSgd, 1.0);
    family("fedavgm", ServerRule::kMomentum, 1.0);
    family("diloco", ServerRule::kNesterov, 0.7);  // DiLoCo's paper
    family("fedadam", ServerRule::kAdam, 0.1);
    family("fedyogi", ServerRule::kYogi, 0.1);
    family("fedadagrad", ServerRule::kAdagrad, 0.1);
    return r;
  }();
  return *r;
}

namespace robust {
namespace {

// A rule that needs nothing but its updates.
RuleKind Plain(std::vector<float> (*rule)(const Updates&)) {
  return {nullptr, [rule](const RuleInput& in) -> StatusOr<std::vector<float>> {
            return rule(in.updates);
          }};
}

// A rule of the updates and f that tolerates f attackers among n when
// n >= per_f * f + plus (`what` says so in its refusal).
RuleKind OfF(const std::string& name, std::vector<float> (*rule)(const Updates&, int), int per_f,
             int plus, const std::string& what) {
  return {[=](int n, int f, int) { return Needs(name, n, f, n >= per_f * f + plus, what); },
          [rule](const RuleInput& in) -> StatusOr<std::vector<float>> {
            return rule(in.updates, in.f);
          }};
}

}  // namespace

Registry<RuleKind>& RobustRules() {
  static Registry<RuleKind>* r = [] {
    auto* r = new Registry<RuleKind>("aggregation.rule");
    r->AddBuiltin("mean", Plain(Mean));
    r->AddBuiltin("median", Plain(Median));
    auto of_f = [r](const std::string& name, std::vector<float> (*rule)(const Updates&, int),
                    int per_f, int plus, const std::string& what) {
      r->AddBuiltin(name, OfF(name, rule, per_f, plus, what));
    };
    of_f("trimmed_mean", TrimmedMean, 2, 1, "n > 2f");
    of_f("krum", Krum, 2, 1, "n > 2f");
    r->AddBuiltin("multi_krum", RuleKind{[](int n, int f, int m) {
                                           return Needs("multi_krum", n, f, n > 2 * f && m <= n,
                                                        "n > 2f and m <= n");
                                         },
                                         [](const RuleInput& in) -> StatusOr<std::vector<float>> {
                                           return MultiKrum(in.updates, in.f, in.m);
                                         }});
    of_f("bulyan", Bulyan, 4, 3, "n >= 4f + 3");
    r->AddBuiltin("norm_bound",
                  RuleKind{nullptr, [](const RuleInput& in) -> StatusOr<std::vector<float>> {
                             return NormBound(in.updates, in.weights, in.max_norm);
                           }});
    r->AddBuiltin("fltrust",
                  RuleKind{nullptr, [](const RuleInput& in) -> StatusOr<std::vector<float>> {
                             if (in.reference.size() != in.updates[0].size()) {
                               return absl::FailedPreconditionError(
                                   "fltrust: no server update on the root data");
                             }
                             return FlTrust(in.updates, in.reference);
                           }});
    return r;
  }();
  return *r;
}

}  // namespace robust
}  // namespace cleave
