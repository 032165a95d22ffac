// The optimizers and losses local training knows (core/names.h).
// Model::Train and ModelPart implement each: ModelPartTest.EveryOptimizerSteps... runs
// every optimizer of the table, OptimizerMatchesPyTorchTest every loss against torch.
#pragma once

#include "core/names.h"

namespace cleave {

// sgd (momentum, nesterov, weight decay as torch.optim.SGD), adam (torch.optim.Adam:
// L2 weight decay), adamw (torch.optim.AdamW: decoupled weight decay).
inline const NameTable& OptimizerNames() {
  static const NameTable t{"train.optimizer", {"sgd", "adam", "adamw"}};
  return t;
}

// cross_entropy (classification, `classes` outputs), bce (binary, one logit), mse and
// mae (regression, one output, Dataset::targets), torchscript (the module
// SetTorchScriptLoss loaded).
inline const NameTable& LossNames() {
  static const NameTable t{"train.loss", {"cross_entropy", "bce", "mse", "mae", "torchscript"}};
  return t;
}

}  // namespace cleave
