// The FedAvg family (aggregation/fedavg.cc): one Strategy, six server update rules.
#pragma once

#include <memory>
#include <string>

#include "aggregation/strategy.h"

namespace cleave {

// How the round's mean delta D moves the global model (fedavg.cc's header comment).
enum class ServerRule { kSgd, kMomentum, kNesterov, kAdagrad, kAdam, kYogi };

// A FedAvg-family strategy called `name` with `rule`, configured from the job's
// clients, train, strategy and run sections (StrategyJob). FedProx is fedavg whose clients train
// with strategy.proximal_mu (name "fedprox").
std::unique_ptr<Strategy> MakeFedAvgFamily(const std::string& name, ServerRule rule,
                                           const StrategyJob& job);

}  // namespace cleave
