// Internal to models/ (includes LibTorch): one optimizer update of one tensor, as
// torch.optim defines SGD (momentum, nesterov, weight decay), Adam (L2 weight decay)
// and AdamW (decoupled weight decay), with betas (0.9, 0.999) and eps 1e-8. Whole-model
// training (model.cc) and the parts of a cut model (part.cc) step through it.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "models/model.h"

namespace cleave {

// Updates `p` in place from its gradient `g` (which it may change) with `o`'s optimizer,
// lr, momentum, nesterov and weight_decay. `first` and `second` are the tensor's state
// (zeros at the start; `second` unused by sgd); `step` counts this tensor's updates
// including this one (Adam's bias correction).
inline void OptimizerStep(const LocalTrainOptions& o, int64_t step, torch::Tensor p,
                          torch::Tensor g, torch::Tensor& first, torch::Tensor& second) {
  if (o.optimizer == "sgd") {
    if (o.weight_decay != 0) g.add_(p, o.weight_decay);
    if (o.momentum == 0) {
      p.add_(g, -o.lr);
      return;
    }
    first.mul_(o.momentum).add_(g);  // a zero buffer makes the first step g
    if (o.nesterov) {
      g.add_(first, o.momentum);
      p.add_(g, -o.lr);
    } else {
      p.add_(first, -o.lr);
    }
    return;
  }
  constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
  if (o.optimizer == "adamw") {
    p.mul_(1 - o.lr * o.weight_decay);
  } else if (o.weight_decay != 0) {
    g.add_(p, o.weight_decay);
  }
  first.mul_(kBeta1).add_(g, 1 - kBeta1);
  second.mul_(kBeta2).addcmul_(g, g, 1 - kBeta2);
  const double bias1 = 1 - std::pow(kBeta1, step), bias2 = 1 - std::pow(kBeta2, step);
  auto denom = (second.sqrt() / std::sqrt(bias2)).add_(kEps);
  p.addcdiv_(first, denom, -o.lr / bias1);
}

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
