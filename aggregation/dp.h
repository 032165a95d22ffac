// DP-FedAvg (McMahan et al. 2018) with fixed or adaptive clipping (Andrew et al. 2021):
// each client's update is clipped to L2 norm C and the clipped updates averaged with
// equal weights; Gaussian noise of std z·C/n is added centrally by the server, or
// (dp.noise: distributed) by the clients, each N(0, (z·C)^2 / n), before secure
// aggregation. Adaptive clipping moves C toward the target quantile gamma of the norms:
//   C <- C · exp(-eta_C (b - gamma)),  b = (#{||Delta_i|| <= C} + N(0, sigma_b^2)) / n
// (b is the noised fraction NOT clipped), and the update noise uses
// z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) so that both releases together cost what
// noise multiplier z costs (their Theorem 1). Every round adds one sampled-Gaussian step
// (sampling rate = clients sampled / clients available) to an RDP accountant.
#pragma once

#include <memory>

#include "aggregation/strategy.h"

namespace cleave {

// The factor that scales an update of L2 norm `norm` to norm at most `clip` (1 when it
// is already within, including norm 0).
double ClipFactor(double norm, double clip);

// z_Delta for adaptive clipping; INVALID_ARGUMENT unless 2 sigma_b > z.
StatusOr<double> UpdateNoiseMultiplier(double z, double sigma_b);

std::unique_ptr<Strategy> MakeDpStrategy(std::unique_ptr<Strategy> inner, const DpConfig& config,
                                         uint64_t seed);
std::unique_ptr<Strategy> MakeRobustStrategy(std::unique_ptr<Strategy> inner,
                                             const AggregationConfig& config);
// EF21's server side (compression.update topk:F:ef21); see wrappers.cc.
std::unique_ptr<Strategy> MakeEstimateStrategy(std::unique_ptr<Strategy> inner);

}  // namespace cleave
