#include "models/fast_trainer.h"

#include <ATen/ops/_slow_conv2d_backward.h>
#include <ATen/ops/_slow_conv2d_forward.h>
#include <ATen/ops/mkldnn_convolution.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "models/relu_pool_kernels.h"

namespace cleave {

namespace nn = torch::nn;

void ReluMaxPool2x2Forward(const torch::Tensor& input, torch::Tensor& out, torch::Tensor& winner) {
  const auto x = input.contiguous();
  out = torch::empty({x.size(0), x.size(1), x.size(2) / 2, x.size(3) / 2}, x.options());
  winner = torch::empty(out.sizes(), x.options().dtype(torch::kInt32));
  kernels::ReluMaxPool2x2(x.data_ptr<float>(), x.size(0) * x.size(1), x.size(2), x.size(3),
                          out.data_ptr<float>(), winner.data_ptr<int32_t>());
}

torch::Tensor ReluMaxPool2x2Backward(const torch::Tensor& grad_out, const torch::Tensor& winner,
                                     at::IntArrayRef x_sizes) {
  const auto g = grad_out.contiguous();
  auto gx = torch::empty(x_sizes, g.options());
  kernels::ReluMaxPool2x2Grad(g.data_ptr<float>(), winner.data_ptr<int32_t>(),
                              x_sizes[0] * x_sizes[1], x_sizes[2], x_sizes[3],
                              gx.data_ptr<float>());
  return gx;
}

struct FastTrainer::Layer {
  enum Kind { kConv, kLinear, kRelu, kReluPool, kFlatten } kind;
  torch::Tensor weight, bias;  // kConv, kLinear (bias may be undefined)
  int64_t kh = 0, kw = 0, ph = 0, pw = 0;
  // Kept from forward for backward.
  torch::Tensor input, output, winner;
};

FastTrainer::~FastTrainer() = default;

std::unique_ptr<FastTrainer> FastTrainer::Compile(const nn::Sequential& seq) {
  auto t = std::make_unique<FastTrainer>();
  // Built-in models are Sequentials of stages, each a Sequential of layers.
  std::vector<std::shared_ptr<nn::Module>> modules;
  for (const auto& stage : seq->children()) {
    if (auto inner = std::dynamic_pointer_cast<nn::SequentialImpl>(stage)) {
      for (const auto& m : inner->children()) modules.push_back(m);
    } else {
      modules.push_back(stage);
    }
  }
  for (const auto& m : modules) {
    Layer l;
    if (auto conv = std::dynamic_pointer_cast<nn::Conv2dImpl>(m)) {
      const auto& o = conv->options;
      const auto* pad = c10::get_if<torch::ExpandingArray<2>>(&o.padding());
      if (!pad || (*o.stride())[0] != 1 || (*o.stride())[1] != 1 || (*o.dilation())[0] != 1 ||
          (*o.dilation())[1] != 1 || o.groups() != 1 ||
          !c10::holds_alternative<torch::enumtype::kZeros>(o.padding_mode())) {
        return nullptr;
      }
      l.kind = Layer::kConv;
      l.weight = conv->weight;
      l.bias = conv->bias;
      l.kh = (*o.kernel_size())[0];
      l.kw = (*o.kernel_size())[1];
      l.ph = (**pad)[0];
      l.pw = (**pad)[1];
    } else if (auto lin = std::dynamic_pointer_cast<nn::LinearImpl>(m)) {
      l.kind = Layer::kLinear;
      l.weight = lin->weight;
      l.bias = lin->bias;
    } else if (std::dynamic_pointer_cast<nn::ReLUImpl>(m)) {
      l.kind = Layer::kRelu;
    } else if (std::dynamic_pointer_cast<ReluMaxPoolImpl>(m)) {
      l.kind = Layer::kReluPool;
    } else if (auto flat = std::dynamic_pointer_cast<nn::FlattenImpl>(m)) {
      if (flat->options.start_dim() != 1 || flat->options.end_dim() != -1) return nullptr;
      l.kind = Layer::kFlatten;
    } else {
      return nullptr;
    }
    for (auto* p : {&l.weight, &l.bias}) {
      if (p->defined() && !p->mutable_grad().defined()) p->mutable_grad() = torch::zeros_like(*p);
    }
    t->layers_.push_back(std::move(l));
  }
  const auto first = std::find_if(t->layers_.begin(), t->layers_.end(),
                                  [](const Layer& l) { return l.weight.defined(); });
  if (first == t->layers_.end()) return nullptr;  // nothing to train
  t->first_trainable_ = static_cast<size_t>(first - t->layers_.begin());
  return t;
}

namespace {

// The kernel choices below were measured on LeNet-5's shapes at batch 64 on one thread
// (docs/benchmarks.md): with one input channel im2col + BLAS wins everything; with more,
// oneDNN wins the forward pass, and the weight gradient computed as oneDNN's forward
// convolution of the transposed input with the transposed output gradient beats both
// backward kernels; im2col + BLAS wins the input gradient. Both kernels compute the same
// sums; only rounding differs.
bool UseOneDnn() { return at::hasMKLDNN(); }

torch::Tensor ConvForward(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                          int64_t kh, int64_t kw, int64_t ph, int64_t pw) {
  const c10::optional<torch::Tensor> bias = b.defined() ? c10::optional<torch::Tensor>(b) : c10::nullopt;
  if (UseOneDnn() && x.size(1) > 1) {
    return at::mkldnn_convolution(x, w, bias, {ph, pw}, {1, 1}, {1, 1}, 1);
  }
  return at::_slow_conv2d_forward(x, w, {kh, kw}, bias, {1, 1}, {ph, pw});
}

// d loss / d w for y = conv(x, w) + b with output gradient g.
void ConvWeightGrad(const torch::Tensor& g, const torch::Tensor& x, torch::Tensor& w, int64_t kh,
                    int64_t kw, int64_t ph, int64_t pw) {
  torch::Tensor gw;
  if (UseOneDnn() && x.size(1) > 1) {
    // gw[o][i][r][s] = sum over n, y, x of g[n][o][y][x] * xpad[n][i][y+r][x+s]: a
    // convolution of x (batch and channels swapped) with g (likewise) as the kernel.
    gw = at::mkldnn_convolution(x.transpose(0, 1).contiguous(), g.transpose(0, 1).contiguous(),
                                c10::nullopt, {ph, pw}, {1, 1}, {1, 1}, 1)
             .transpose(0, 1);
  } else {
    gw = std::get<1>(at::_slow_conv2d_backward(g, x, w, {kh, kw}, {1, 1}, {ph, pw},
                                               {false, true, false}));
  }
  w.mutable_grad().copy_(gw);
}

torch::Tensor ConvInputGrad(const torch::Tensor& g, const torch::Tensor& x, const torch::Tensor& w,
                            int64_t kh, int64_t kw, int64_t ph, int64_t pw) {
  return std::get<0>(
      at::_slow_conv2d_backward(g, x, w, {kh, kw}, {1, 1}, {ph, pw}, {true, false, false}));
}

// Mean cross-entropy of logits [n, c] against labels; writes d loss / d logits.
double CrossEntropy(const torch::Tensor& logits, const torch::Tensor& labels, torch::Tensor& grad) {
  const int64_t n = logits.size(0), c = logits.size(1);
  grad = torch::empty_like(logits);
  const float* z = logits.data_ptr<float>();
  const int64_t* y = labels.data_ptr<int64_t>();
  float* g = grad.data_ptr<float>();
  double total = 0;
  for (int64_t i = 0; i < n; ++i, z += c, g += c) {
    TORCH_CHECK(y[i] >= 0 && y[i] < c, "label ", y[i], " out of range for ", c, " classes");
    float mx = z[0];
    for (int64_t k = 1; k < c; ++k) mx = std::max(mx, z[k]);
    double sum = 0;
    for (int64_t k = 0; k < c; ++k) sum += g[k] = std::exp(z[k] - mx);
    total += std::log(sum) + mx - z[y[i]];
    const float scale = static_cast<float>(1.0 / (sum * n));
    for (int64_t k = 0; k < c; ++k) g[k] *= scale;
    g[y[i]] -= 1.0f / n;
  }
  return total / n;
}

}  // namespace

double FastTrainer::ForwardBackward(const torch::Tensor& x, const torch::Tensor& y) {
  torch::NoGradGuard no_grad;
  torch::Tensor a = x.contiguous();
  for (auto& l : layers_) {
    l.input = a;
    switch (l.kind) {
      case Layer::kConv:
        a = ConvForward(a, l.weight, l.bias, l.kh, l.kw, l.ph, l.pw);
        break;
      case Layer::kLinear:
        a = l.bias.defined() ? at::addmm(l.bias, a, l.weight.t()) : at::mm(a, l.weight.t());
        break;
      case Layer::kRelu:
        // In place on the previous layer's output, which its backward does not need
        // (never on the caller's batch).
        a = &l == &layers_[0] ? a.clamp_min(0) : a.clamp_min_(0);
        break;
      case Layer::kReluPool: {
        torch::Tensor out;
        ReluMaxPool2x2Forward(a, out, l.winner);
        a = out;
        break;
      }
      case Layer::kFlatten:
        a = a.reshape({a.size(0), -1});
        break;
    }
    l.output = a;
  }
  torch::Tensor g;
  const double loss = CrossEntropy(a, y, g);
  // Layers before the first with parameters need no gradient (nor does the batch).
  for (size_t i = layers_.size(); i-- > first_trainable_;) {
    Layer& l = layers_[i];
    const bool need_input_grad = i > first_trainable_;
    switch (l.kind) {
      case Layer::kConv:
        ConvWeightGrad(g, l.input, l.weight, l.kh, l.kw, l.ph, l.pw);
        if (l.bias.defined()) at::sum_out(l.bias.mutable_grad(), g, {0, 2, 3});
        if (need_input_grad) g = ConvInputGrad(g, l.input, l.weight, l.kh, l.kw, l.ph, l.pw);
        break;
      case Layer::kLinear:
        at::mm_out(l.weight.mutable_grad(), g.t(), l.input);
        if (l.bias.defined()) at::sum_out(l.bias.mutable_grad(), g, {0});
        if (need_input_grad) g = at::mm(g, l.weight);
        break;
      case Layer::kRelu:
        g = g.contiguous();
        kernels::ReluGrad(l.output.data_ptr<float>(), g.numel(), g.data_ptr<float>());
        break;
      case Layer::kReluPool:
        g = ReluMaxPool2x2Backward(g, l.winner, l.input.sizes());
        break;
      case Layer::kFlatten:
        g = g.reshape(l.input.sizes());
        break;
    }
  }
  for (auto& l : layers_) l.input = l.output = l.winner = torch::Tensor();
  return loss;
}

}  // namespace cleave
