// The built-in losses (models/losses.h), as torch.nn.functional defines them.
#include "models/losses.h"
#include "models/kinds.h"

#include <torch/script.h>
#include <torch/torch.h>

namespace cleave {
namespace {

namespace F = torch::nn::functional;

at::Tensor CrossEntropy(const LossBatch& b) {
  auto o = F::CrossEntropyFuncOptions().label_smoothing(b.label_smoothing);
  if (b.sum) o.reduction(torch::kSum);
  if (b.out.dim() == 3) {  // next-token prediction: [n, T, vocab] against [n, T]
    return F::cross_entropy(b.out.reshape({-1, b.out.size(2)}), b.labels.reshape({-1}), o);
  }
  return F::cross_entropy(b.out, b.labels, o);
}

at::Tensor Bce(const LossBatch& b) {
  auto o = F::BinaryCrossEntropyWithLogitsFuncOptions();
  if (b.sum) o.reduction(torch::kSum);
  return F::binary_cross_entropy_with_logits(b.out.reshape({-1}), b.labels.to(torch::kFloat32), o);
}

at::Tensor Mse(const LossBatch& b) {
  auto o = F::MSELossFuncOptions();
  if (b.sum) o.reduction(torch::kSum);
  return F::mse_loss(b.out.reshape({-1}), b.targets, o);
}

at::Tensor Mae(const LossBatch& b) {
  auto o = F::L1LossFuncOptions();
  if (b.sum) o.reduction(torch::kSum);
  return F::l1_loss(b.out.reshape({-1}), b.targets, o);
}

at::Tensor TorchScriptLoss(const LossBatch& b) {
  TORCH_CHECK(b.script != nullptr, "no TorchScript loss loaded");
  auto mean = b.script->forward({b.out, b.targets.defined() ? b.targets : b.labels}).toTensor();
  TORCH_CHECK(mean.numel() == 1 && mean.is_floating_point(),
              "the TorchScript loss must return a floating-point scalar, not a tensor of shape ",
              mean.sizes());
  return b.sum ? mean.reshape({}) * b.out.size(0) : mean.reshape({});
}

}  // namespace

Registry<LossKind>& Losses() {
  static Registry<LossKind>* losses = [] {
    auto* r = new Registry<LossKind>("train.loss");
    r->AddBuiltin("cross_entropy", {LossTask::kClasses, CrossEntropy});
    r->AddBuiltin("bce", {LossTask::kBinary, Bce});
    r->AddBuiltin("mse", {LossTask::kRegression, Mse});
    r->AddBuiltin("mae", {LossTask::kRegression, Mae});
    r->AddBuiltin(kScriptedLoss, {LossTask::kAny, TorchScriptLoss});  // models/kinds.h
    return r;
  }();
  return *losses;
}

}  // namespace cleave
