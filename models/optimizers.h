// The optimizers local training knows (train.optimizer), in a registry, each as
// torch.optim defines it with betas (0.9, 0.999) and eps 1e-8 where it has them:
//
//   sgd    momentum, nesterov, weight decay (torch.optim.SGD)
//   adam   L2 weight decay (torch.optim.Adam)
//   adamw  decoupled weight decay (torch.optim.AdamW)
//
// Whole-model training (Model::Train) and the parts of a cut model (ModelPart) step
// every tensor through the entry of their train.optimizer. An optimizer of one's own is
// a step function in its own LibTorch file plus one registration:
//
//   Optimizers().Add("lion", {/*second_moment=*/false, LionStep});
//
// The header is LibTorch-free (tensors are only named): the job layer checks names.
#pragma once

#include <cstdint>

#include "core/registry.h"

namespace at {
class Tensor;
}  // namespace at

namespace cleave {

struct LocalTrainOptions;  // models/model.h

struct OptimizerKind {
  // Whether it keeps a second state tensor per parameter (Adam's second moment).
  bool second_moment = false;
  // Updates `p` in place from its gradient `g` (handles to the tensors; it may change g) with o's lr,
  // momentum, nesterov and weight_decay. `first` and `second` are the tensor's state
  // (zeros at the start; `second` undefined without second_moment); `step` counts this
  // tensor's updates including this one (bias correction).
  void (*step)(const LocalTrainOptions& o, int64_t step, at::Tensor p, at::Tensor g,
               at::Tensor& first, at::Tensor& second) = nullptr;
};

Registry<OptimizerKind>& Optimizers();

}  // namespace cleave
