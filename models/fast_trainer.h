// Internal to models/ (includes LibTorch): training steps for the built-in models
// without autograd. At batch 64 on one thread LeNet-5's step is a few milliseconds, and
// the autograd graph, the per-op dispatch and the stock pooling and loss kernels cost as
// much as the convolutions (docs/benchmarks.md). This runs the same layers by hand:
// convolutions and matrix products through LibTorch's kernels (the faster of oneDNN and
// im2col + BLAS per operation), pooling, ReLU and the loss in plain loops.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

namespace cleave {

class FastTrainer {
 public:
  // A trainer for `seq` if every module in it is one this runs (Conv2d with stride 1,
  // no dilation or groups; Linear; ReLU; the fused ReLU + 2x2 max-pool; Flatten),
  // else nullptr: train it with autograd.
  static std::unique_ptr<FastTrainer> Compile(const torch::nn::Sequential& seq);

  // Forward and backward of the mean cross-entropy of the model on (x, y) in training
  // mode: sets every parameter's gradient (overwriting it) and returns the mean loss.
  double ForwardBackward(const torch::Tensor& x, const torch::Tensor& y);

  struct Layer;
  ~FastTrainer();

 private:
  std::vector<Layer> layers_;
  size_t first_trainable_ = 0;  // the first layer with parameters
};

// relu(max_pool2d(x, 2)) == max_pool2d(relu(x), 2), fused: LibTorch's CPU
// max_pool2d_with_indices dominates LeNet-5's forward pass at batch 64 on one thread.
struct ReluMaxPoolImpl : torch::nn::Module {
  torch::Tensor forward(torch::Tensor x);
};
TORCH_MODULE(ReluMaxPool);

// The fused ReLU + 2x2 max-pool (floor for odd sizes) on [n, c, h, w] float tensors:
// out = max(0, max of each 2x2 window); `winner` names, per output, the window element
// that won (0..3) or 4 when none was above zero (then the gradient is zero).
void ReluMaxPool2x2Forward(const torch::Tensor& x, torch::Tensor& out, torch::Tensor& winner);
// The gradient with respect to x (of shape `x_sizes`) given the output's gradient.
torch::Tensor ReluMaxPool2x2Backward(const torch::Tensor& grad_out, const torch::Tensor& winner,
                                     at::IntArrayRef x_sizes);

}  // namespace cleave
