// Privacy accounting for the sampled Gaussian mechanism (DP-SGD, DP-FedAvg): Rényi DP
// of each step (Mironov, Talwar, Zhang 2019: integer and fractional orders), composed
// over steps, and converted to (epsilon, delta) with the improved conversion of Canonne,
// Kamath, Steinke 2020 / Balle et al. 2020 (as TF Privacy and Opacus compute it).
#pragma once

#include <vector>

#include "core/status.h"

namespace cleave::dp {

// The orders TF Privacy and Opacus use by default: 1.1, 1.2, ..., 10.9, 12, 13, ..., 63.
std::vector<double> DefaultOrders();

// RDP at each order of `steps` compositions of the sampled Gaussian mechanism with
// sampling rate q in [0, 1] and noise multiplier sigma > 0. Orders must be > 1.
StatusOr<std::vector<double>> ComputeRdp(double q, double noise_multiplier, int64_t steps,
                                         const std::vector<double>& orders);

struct Epsilon {
  double epsilon = 0;
  double order = 0;  // the order that gave the smallest epsilon
};
// The smallest epsilon over the orders for the given RDP values, at delta in (0, 1).
StatusOr<Epsilon> EpsilonFromRdp(const std::vector<double>& orders, const std::vector<double>& rdp,
                                 double delta);

// ComputeRdp then EpsilonFromRdp.
StatusOr<Epsilon> ComputeEpsilon(double q, double noise_multiplier, int64_t steps, double delta,
                                 const std::vector<double>& orders = DefaultOrders());

}  // namespace cleave::dp
