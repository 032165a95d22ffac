// The built-in optimizers (models/optimizers.h), as torch.optim defines them.
#include "models/optimizers.h"

#include <torch/torch.h>

#include <cmath>

#include "models/model.h"

namespace cleave {
namespace {

void SgdStep(const LocalTrainOptions& o, int64_t /*step*/, at::Tensor p, at::Tensor g,
             at::Tensor& first, at::Tensor& /*second*/) {
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
}

// Adam's moments and bias-corrected step, after the weight decay (L2 or decoupled).
void AdamUpdate(const LocalTrainOptions& o, int64_t step, at::Tensor& p, at::Tensor& g,
                at::Tensor& first, at::Tensor& second) {
  constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
  first.mul_(kBeta1).add_(g, 1 - kBeta1);
  second.mul_(kBeta2).addcmul_(g, g, 1 - kBeta2);
  const double bias1 = 1 - std::pow(kBeta1, step), bias2 = 1 - std::pow(kBeta2, step);
  auto denom = (second.sqrt() / std::sqrt(bias2)).add_(kEps);
  p.addcdiv_(first, denom, -o.lr / bias1);
}

void AdamStep(const LocalTrainOptions& o, int64_t step, at::Tensor p, at::Tensor g,
              at::Tensor& first, at::Tensor& second) {
  if (o.weight_decay != 0) g.add_(p, o.weight_decay);
  AdamUpdate(o, step, p, g, first, second);
}

void AdamWStep(const LocalTrainOptions& o, int64_t step, at::Tensor p, at::Tensor g,
               at::Tensor& first, at::Tensor& second) {
  p.mul_(1 - o.lr * o.weight_decay);
  AdamUpdate(o, step, p, g, first, second);
}

}  // namespace

Registry<OptimizerKind>& Optimizers() {
  static Registry<OptimizerKind>* optimizers = [] {
    auto* r = new Registry<OptimizerKind>("train.optimizer");
    r->AddBuiltin("sgd", {false, SgdStep});
    r->AddBuiltin("adam", {true, AdamStep});
    r->AddBuiltin("adamw", {true, AdamWStep});
    return r;
  }();
  return *optimizers;
}

}  // namespace cleave
