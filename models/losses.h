// The losses local training knows (train.loss), in a registry:
//
//   cross_entropy  classes: `classes` outputs against int64 labels (with label
//                  smoothing); text: next-token prediction, [N, T, vocab] against [N, T]
//   bce            binary: one logit against labels 0 and 1
//   mse, mae       regression: one output against Dataset::targets
//   torchscript    the module Model::SetTorchScriptLoss loaded (forward(output, target)
//                  returning a scalar mean), against labels or targets
//
// Each entry says which task it serves (what CheckDataFitsModel and Model::Evaluate
// expect of the data and the model's outputs) and computes a batch's loss. A loss of
// one's own is a function in its own LibTorch file plus one registration:
//
//   Losses().Add("huber", {LossTask::kRegression, HuberLoss});
//
// The header is LibTorch-free (tensors are only named): the job layer checks names.
#pragma once

#include "core/registry.h"

namespace at {
class Tensor;
}  // namespace at
namespace torch {
namespace jit {
struct Module;
}  // namespace jit
}  // namespace torch

namespace cleave {

enum class LossTask {
  kClasses,     // `classes` outputs, int64 labels in [0, classes)
  kBinary,      // one output (a logit), labels 0 and 1
  kRegression,  // one output, float targets
  kAny,         // labels or targets (the data decides)
};

// One batch: the model's outputs, its int64 labels and float targets (undefined when
// the data has none), label smoothing, and the TorchScript loss module (or null).
struct LossBatch {
  const at::Tensor& out;
  const at::Tensor& labels;
  const at::Tensor& targets;
  double label_smoothing = 0;
  torch::jit::Module* script = nullptr;
  bool sum = false;  // the sum over the batch's examples, else their mean
};

struct LossKind {
  LossTask task = LossTask::kClasses;
  // The batch's loss, a scalar tensor under autograd (TORCH_CHECK on a bad batch).
  at::Tensor (*compute)(const LossBatch& batch) = nullptr;
};

Registry<LossKind>& Losses();

}  // namespace cleave
