#include "server/observe/update_noise.h"

#include <algorithm>
#include <array>

#include "server/options.h"

namespace cleave {

bool MeasuresUpdateNoise(const FederationConfig& c) {
  return (c.strategy.name == "fedavg" || c.strategy.name == "fedprox") && c.strategy.server_lr == 1.0 &&
         c.aggregation.rule == "mean" && !c.dp.enabled && !c.secure_aggregation.enabled && !c.split.enabled() &&
         c.scheduler.mode == "sync" && !c.width.enabled;
}

void UpdateNoiseMeter::Reset() {
  MutexLock l(&mu_);
  weight_ = squared_weight_ = weighted_norm_ = 0;
  count_ = 0;
}

void UpdateNoiseMeter::Add(const std::vector<TensorView>& update, double weight) {
  alignas(64) std::array<float, kViewBlock> block;
  double norm = 0;
  for (const TensorView& v : update) {
    for (int64_t i = 0; i < v.numel; i += kViewBlock) {
      const int64_t n = std::min<int64_t>(kViewBlock, v.numel - i);
      v.Read(i, n, block.data());
      for (int64_t k = 0; k < n; ++k) norm += static_cast<double>(block[k]) * block[k];
    }
  }
  MutexLock l(&mu_);
  weight_ += weight;
  squared_weight_ += weight * weight;
  weighted_norm_ += weight * norm;
  ++count_;
}

std::optional<UpdateNoise> UpdateNoiseMeter::Estimate(double mean_squared_norm) const {
  MutexLock l(&mu_);
  if (count_ < 2 || !(weight_ > 0) || !(squared_weight_ > 0)) return std::nullopt;
  const double n_eff = weight_ * weight_ / squared_weight_;
  if (!(n_eff > 1)) return std::nullopt;
  const double a = weighted_norm_ / weight_;
  UpdateNoise u;
  u.noise = (a - mean_squared_norm) / (1 - 1 / n_eff);
  u.signal = mean_squared_norm - u.noise / n_eff;
  return u;
}

double SquaredDistance(const ParameterSet& a, const ParameterSet& b) {
  double sum = 0;
  for (const Tensor& t : a.tensors()) {
    const Tensor* u = b.Find(t.name);
    if (u == nullptr || u->values.size() != t.values.size()) continue;
    for (size_t i = 0; i < t.values.size(); ++i) {
      const double d = static_cast<double>(t.values[i]) - u->values[i];
      sum += d * d;
    }
  }
  return sum;
}

}  // namespace cleave
