// The built-in optimizers (models/optimizers.h), as torch.optim defines them.
#include "models/optimizers.h"

#include <ATen/Parallel.h>
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

constexpr double kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;

// Adam's moments and bias-corrected step as torch.optim.Adam(W) computes them, in one
// pass over each value: p *= decay (AdamW's decoupled weight decay; 1 for Adam), g +=
// l2 * p (Adam's L2 decay; 0 for AdamW), m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). The float32 operations
// are torch's, in its order; one pass instead of eight (and two temporaries) matters
// because an optimizer step over a whole model is memory-bound.
void AdamUpdate(const LocalTrainOptions& o, int64_t step, at::Tensor& p, at::Tensor& g,
                at::Tensor& first, at::Tensor& second, double decay, double l2) {
  const double bias1 = 1 - std::pow(kBeta1, step), bias2 = 1 - std::pow(kBeta2, step);
  const bool flat = p.scalar_type() == at::kFloat && g.scalar_type() == at::kFloat && p.is_contiguous() &&
                    g.is_contiguous() && first.is_contiguous() && second.is_contiguous() &&
                    g.numel() == p.numel() && first.numel() == p.numel() && second.numel() == p.numel();
  if (!flat) {  // the same steps as separate operators
    if (decay != 1) p.mul_(decay);
    if (l2 != 0) g.add_(p, l2);
    first.mul_(kBeta1).add_(g, 1 - kBeta1);
    second.mul_(kBeta2).addcmul_(g, g, 1 - kBeta2);
    auto denom = (second.sqrt() / std::sqrt(bias2)).add_(kEps);
    p.addcdiv_(first, denom, -o.lr / bias1);
    return;
  }
  float* pp = p.data_ptr<float>();
  float* gp = g.data_ptr<float>();
  float* mp = first.data_ptr<float>();
  float* vp = second.data_ptr<float>();
  const float fdecay = static_cast<float>(decay), fl2 = static_cast<float>(l2);
  const float b1 = static_cast<float>(kBeta1), c1 = static_cast<float>(1 - kBeta1);
  const float b2 = static_cast<float>(kBeta2), c2 = static_cast<float>(1 - kBeta2);
  const float root2 = static_cast<float>(std::sqrt(bias2)), eps = static_cast<float>(kEps);
  const float rate = static_cast<float>(-o.lr / bias1);
  at::parallel_for(0, p.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float w = pp[i] * fdecay;
      const float grad = gp[i] + fl2 * w;
      const float m = mp[i] * b1 + c1 * grad;
      const float v = vp[i] * b2 + c2 * grad * grad;
      mp[i] = m;
      vp[i] = v;
      pp[i] = w + rate * (m / (std::sqrt(v) / root2 + eps));
      if (fl2 != 0) gp[i] = grad;  // as Adam's g.add_(p, l2) leaves it
    }
  });
}

void AdamStep(const LocalTrainOptions& o, int64_t step, at::Tensor p, at::Tensor g,
              at::Tensor& first, at::Tensor& second) {
  AdamUpdate(o, step, p, g, first, second, 1.0, o.weight_decay);
}

void AdamWStep(const LocalTrainOptions& o, int64_t step, at::Tensor p, at::Tensor g,
               at::Tensor& first, at::Tensor& second) {
  AdamUpdate(o, step, p, g, first, second, 1 - o.lr * o.weight_decay, 0.0);
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
