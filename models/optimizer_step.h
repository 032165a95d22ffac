// Internal to models/ (includes LibTorch): what whole-model training (model.cc) and the
// parts of a cut model (part.cc) do to gradients before the optimizer's step
// (models/optimizers.h).
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "models/model.h"

namespace cleave {

// Scales `grads` (undefined ones skipped) so that their global L2 norm is at most
// `clip_norm`, as torch.nn.utils.clip_grad_norm_ does; 0 = no clipping.
inline void ClipGradNorm(std::vector<torch::Tensor>& grads, double clip_norm) {
  if (clip_norm <= 0) return;
  double sq = 0;
  for (const auto& g : grads) {
    if (g.defined()) sq += g.pow(2).sum().item<double>();
  }
  const double coef = clip_norm / (std::sqrt(sq) + 1e-6);
  if (coef >= 1) return;
  for (auto& g : grads) {
    if (g.defined()) g.mul_(coef);
  }
}

}  // namespace cleave
