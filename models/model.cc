#include "models/model.h"

#include <atomic>
#include <torch/script.h>
#include <torch/torch.h>

#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <sstream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/fast_trainer.h"
#include "models/gpt.h"
#include "models/names.h"
#include "models/optimizer_step.h"
#include "models/torch_stages.h"

namespace cleave {
namespace {

namespace nn = torch::nn;

// The fused ReLU + 2x2 max-pool under autograd (for parts of split models and for
// inference); Model::Train runs it through FastTrainer.
struct ReluMaxPool2x2 : torch::autograd::Function<ReluMaxPool2x2> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x) {
    torch::Tensor out, winner;
    ReluMaxPool2x2Forward(x.contiguous(), out, winner);
    ctx->save_for_backward({winner});
    ctx->saved_data["sizes"] = x.sizes();
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    return {ReluMaxPool2x2Backward(grads[0], ctx->get_saved_variables()[0], sizes)};
  }
};

}  // namespace

torch::Tensor ReluMaxPoolImpl::forward(torch::Tensor x) {
  if (x.dim() != 4 || x.scalar_type() != torch::kFloat32) {
    return torch::max_pool2d(torch::relu(x), 2);
  }
  return ReluMaxPool2x2::apply(x);
}

namespace {

// One stage of a staged model: a Sequential with a concrete forward() so that it can
// sit inside the top-level Sequential.
struct StageImpl : nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return SequentialImpl::forward(x); }
};
TORCH_MODULE(Stage);

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The number of elements `features` outputs per example of `shape`.
int64_t FlatSize(nn::Sequential& features, const std::vector<int64_t>& shape) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> batch = {1};
  batch.insert(batch.end(), shape.begin(), shape.end());
  return features->forward(torch::zeros(batch)).numel();
}

// Layers are built one statement at a time, first to last: each draws its initial
// weights from the seeded generator in turn. (Built as the arguments of one call, their
// order would be the compiler's: GCC builds them last to first, clang first to last.)

nn::Sequential BuildMlp(const ModelSpec& s) {
  nn::Sequential seq;
  seq->push_back(Stage(nn::Flatten(), nn::Linear(Product(s.input_shape), 200), nn::ReLU()));
  seq->push_back(Stage(nn::Linear(200, 200), nn::ReLU()));
  seq->push_back(Stage(nn::Linear(200, s.num_classes)));
  return seq;
}

nn::Sequential BuildLeNet5(const ModelSpec& s) {
  nn::Sequential seq;
  seq->push_back(Stage(nn::Conv2d(nn::Conv2dOptions(s.input_shape[0], 6, 5)), ReluMaxPool()));
  seq->push_back(Stage(nn::Conv2d(nn::Conv2dOptions(6, 16, 5)), ReluMaxPool()));
  const int64_t flat = FlatSize(seq, s.input_shape);
  seq->push_back(Stage(nn::Flatten(), nn::Linear(flat, 120), nn::ReLU()));
  seq->push_back(Stage(nn::Linear(120, 84), nn::ReLU()));
  seq->push_back(Stage(nn::Linear(84, s.num_classes)));
  return seq;
}

// A VGG-style network for small images with nine stages, so that where it is cut matters
// for split learning: activation sizes and per-stage compute differ widely.
nn::Sequential BuildVgg(const ModelSpec& s) {
  auto conv = [](int64_t in, int64_t out) {
    return nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1));
  };
  nn::Sequential seq;                                            // for 28x28 inputs:
  seq->push_back(Stage(conv(s.input_shape[0], 8), nn::ReLU()));  // 8x28x28
  seq->push_back(Stage(conv(8, 16), ReluMaxPool()));              // 16x14x14
  seq->push_back(Stage(conv(16, 32), nn::ReLU()));                // 32x14x14
  seq->push_back(Stage(conv(32, 32), ReluMaxPool()));             // 32x7x7
  seq->push_back(Stage(conv(32, 64), nn::ReLU()));                // 64x7x7
  seq->push_back(Stage(conv(64, 64), ReluMaxPool()));             // 64x3x3
  const int64_t flat = FlatSize(seq, s.input_shape);
  seq->push_back(Stage(nn::Flatten(), nn::Linear(flat, 256), nn::ReLU()));
  seq->push_back(Stage(nn::Linear(256, 128), nn::ReLU()));
  seq->push_back(Stage(nn::Linear(128, s.num_classes)));
  // He initialisation (as torchvision's VGG): with LibTorch's default, nine plain layers
  // start with vanishing activations and the loss does not move.
  torch::NoGradGuard no_grad;
  for (auto& p : seq->named_parameters(/*recurse=*/true)) {
    if (p.key().find("weight") != std::string::npos) {
      torch::nn::init::kaiming_normal_(p.value(), 0, torch::kFanIn, torch::kReLU);
    } else {
      p.value().zero_();
    }
  }
  return seq;
}

nn::Sequential BuildCnn(const ModelSpec& s) {
  nn::Sequential seq;
  seq->push_back(
      Stage(nn::Conv2d(nn::Conv2dOptions(s.input_shape[0], 32, 3).padding(1)), ReluMaxPool()));
  seq->push_back(Stage(nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)), ReluMaxPool()));
  const int64_t flat = FlatSize(seq, s.input_shape);
  seq->push_back(Stage(nn::Flatten(), nn::Linear(flat, 128), nn::ReLU()));
  seq->push_back(Stage(nn::Linear(128, s.num_classes)));
  return seq;
}

// He et al.'s basic block: conv-BN-ReLU-conv-BN plus the input (a 1x1 conv + BN when
// the shape changes), then ReLU.
struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module(
            "conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", nn::BatchNorm2d(out))),
        conv2(register_module("conv2",
                              nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      shortcut = register_module(
          "shortcut",
          nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
                         nn::BatchNorm2d(out)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = bn2(conv2(torch::relu(bn1(conv1(x)))));
    return torch::relu(y + (shortcut ? shortcut->forward(x) : x));
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

nn::Sequential BuildResNet(const ModelSpec& s) {
  nn::Sequential seq;
  seq->push_back(
      Stage(nn::Conv2d(nn::Conv2dOptions(s.input_shape[0], 16, 3).padding(1).bias(false)),
            nn::BatchNorm2d(16), nn::ReLU()));
  seq->push_back(Stage(BasicBlock(16, 16, 1)));
  seq->push_back(Stage(BasicBlock(16, 32, 2)));
  seq->push_back(Stage(BasicBlock(32, 64, 2)));
  seq->push_back(Stage(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)), nn::Flatten(),
                       nn::Linear(64, s.num_classes)));
  torch::NoGradGuard no_grad;  // He initialisation of the convolutions, as torchvision's
  for (auto& p : seq->named_parameters(/*recurse=*/true)) {
    if (p.value().dim() == 4) {
      torch::nn::init::kaiming_normal_(p.value(), 0, torch::kFanOut, torch::kReLU);
    }
  }
  return seq;
}

enum class Input { kAny, kImages, kTokens };

struct Builtin {
  const char* name;
  nn::Sequential (*build)(const ModelSpec&);
  Input input;  // kImages: [C, H, W]; kTokens: text, sized by ModelSpec::gpt
};

// Every built-in model, in one place: BuiltinModelNames, the config's validation and
// the factory read it.
constexpr Builtin kBuiltins[] = {
    {"mlp", BuildMlp, Input::kAny},       {"lenet5", BuildLeNet5, Input::kImages},
    {"cnn", BuildCnn, Input::kImages},    {"vgg", BuildVgg, Input::kImages},
    {"resnet", BuildResNet, Input::kImages}, {"gpt", BuildGpt, Input::kTokens},
};

Status CheckGptSpec(const GptConfig& g, const LoraConfig& lora) {
  if (lora.rank < 0 || lora.rank > 4096 || !(lora.alpha > 0) || !(lora.dropout >= 0 && lora.dropout < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA rank ", lora.rank, ", alpha ", lora.alpha,
                                                   ", dropout ", lora.dropout, " (rank in [0, 4096], "
                                                   "alpha > 0, dropout in [0, 1))"));
  }
  for (const std::string& t : lora.targets) RETURN_IF_ERROR(LoraTargetNames().Check(t));
  if (g.vocab < 2 || g.vocab > (1 << 24) || g.context < 1 || g.layers < 1 || g.heads < 1 ||
      g.dim < 1 || g.dim % g.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model gpt cannot have vocab ", g.vocab, ", context ", g.context, ", ", g.layers,
        " layers, ", g.heads, " heads of width ", g.dim,
        " (vocab in [2, 2^24], the rest >= 1, dim divisible by heads)"));
  }
  return absl::OkStatus();
}

// The built-in model `spec` names. INVALID_ARGUMENT for an unknown name or an input
// shape it cannot take.
StatusOr<nn::Sequential> BuildBuiltin(const ModelSpec& spec) {
  for (const Builtin& b : kBuiltins) {
    if (spec.name != b.name) continue;
    const std::string shape = absl::StrJoin(spec.input_shape, "x");
    if (b.input == Input::kTokens) {
      RETURN_IF_ERROR(CheckGptSpec(spec.gpt, spec.lora));
    } else if (spec.input_shape.empty() || Product(spec.input_shape) <= 0 || spec.num_classes < 1 ||
               (b.input == Input::kImages && spec.input_shape.size() != 3)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model ", b.name, " cannot take input ", shape, " with ", spec.num_classes,
                       " classes", b.input == Input::kImages ? " (it needs [C, H, W])" : ""));
    }
    torch::manual_seed(spec.seed);
    try {
      return b.build(spec);
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(absl::StrCat("model ", b.name, " cannot take input ",
                                                     shape, " (too small?): ",
                                                     e.what_without_backtrace()));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown model '", spec.name, "' (",
                                                 absl::StrJoin(BuiltinModelNames(), ", "),
                                                 ", torchscript)"));
}

// Appends the floating-point buffers (BatchNorm's running statistics; not its integer
// batch counter) to `out`: the tensors FedAvg averages besides the parameters.
template <typename Named>
void AppendFloatBuffers(const Named& buffers, const std::string& prefix,
                        std::vector<std::pair<std::string, torch::Tensor>>& out) {
  for (const auto& b : buffers) {
    if (b.value().is_floating_point()) out.emplace_back(prefix + b.key(), b.value());
  }
}

// A batch of examples as the model's input: normalised floats [n, shape...]; for text,
// the token ids (int64 [n, length]).
torch::Tensor ExamplesToTensor(const Dataset& d) {
  std::vector<int64_t> sizes = {d.size};
  sizes.insert(sizes.end(), d.shape.begin(), d.shape.end());
  torch::Tensor x;
  if (d.type == ExampleType::kToken) {
    return torch::from_blob(const_cast<uint8_t*>(d.bytes.data()), sizes, torch::kInt32)
        .to(torch::kInt64);
  }
  if (d.type == ExampleType::kUint8) {
    x = torch::from_blob(const_cast<uint8_t*>(d.bytes.data()), sizes, torch::kUInt8)
            .to(torch::kFloat32) / 255.0f;
  } else {
    x = torch::from_blob(const_cast<uint8_t*>(d.bytes.data()), sizes, torch::kFloat32).clone();
  }
  if (d.mean.empty()) return x;
  if (d.mean.size() == 1) return (x - d.mean[0]) / d.stddev[0];
  std::vector<int64_t> per_channel(sizes.size(), 1);
  per_channel[1] = static_cast<int64_t>(d.mean.size());  // 1 or shape[0]
  auto mean = torch::tensor(d.mean).view(per_channel);
  auto stddev = torch::tensor(d.stddev).view(per_channel);
  return (x - mean) / stddev;
}

torch::Tensor LabelsToTensor(const Dataset& d) {
  return torch::from_blob(const_cast<int64_t*>(d.labels.data()), {d.size}, torch::kInt64)
      .clone();
}

// Random crop (after zero padding) and horizontal flip of a batch of images [n, c, h, w].
torch::Tensor Augment(const torch::Tensor& x, const Augmentation& a, at::Generator& gen) {
  auto out = x;
  const int64_t n = x.size(0), h = x.size(2), w = x.size(3);
  if (a.crop_padding > 0) {
    const int64_t p = a.crop_padding;
    auto padded = torch::constant_pad_nd(x, {p, p, p, p}, 0);
    auto offsets = torch::randint(0, 2 * p + 1, {n, 2}, gen, torch::kInt64);
    const auto* o = offsets.data_ptr<int64_t>();
    out = torch::empty_like(x);
    for (int64_t i = 0; i < n; ++i) {
      out[i].copy_(padded[i].narrow(1, o[2 * i], h).narrow(2, o[2 * i + 1], w));
    }
  }
  if (a.flip) {
    auto flip = torch::rand({n, 1, 1, 1}, gen) < 0.5;
    out = torch::where(flip, out.flip({3}), out);
  }
  return out;
}

}  // namespace

struct Model::Impl {
  nn::Sequential seq{nullptr};                  // built-in models
  std::unique_ptr<FastTrainer> fast;            // seq's training step without autograd
  std::unique_ptr<torch::jit::Module> script;   // TorchScript models
  std::unique_ptr<torch::jit::Module> loss_script;  // SetTorchScriptLoss

  // Cached tensors of the last dataset seen (clients train on one dataset all run long),
  // keyed by its contents: a dataset at the address of an earlier one (a temporary
  // subset, say) is not mistaken for it.
  size_t cached_key = 0;
  bool cached = false;
  // Examples, labels, regression targets (undefined if none). Text: x holds each
  // sequence but its last token, y (int64 [n, length - 1]) each next token.
  torch::Tensor x, y, t;

  // Parameters, then floating-point buffers (AppendFloatBuffers).
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() const {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    if (script) {
      for (const auto& p : script->named_parameters(/*recurse=*/true)) {
        out.emplace_back(p.name, p.value);
      }
      for (const auto& b : script->named_buffers(/*recurse=*/true)) {
        if (b.value.is_floating_point()) out.emplace_back(b.name, b.value);
      }
    } else {
      for (const auto& p : seq->named_parameters(/*recurse=*/true)) {
        out.emplace_back(p.key(), p.value());
      }
      AppendFloatBuffers(seq->named_buffers(/*recurse=*/true), "", out);
    }
    return out;
  }

  torch::Tensor Forward(const torch::Tensor& in) {
    if (script) return script->forward({in}).toTensor();
    return seq->forward(in);
  }

  void SetTraining(bool on) {
    if (script) {
      script->train(on);
    } else {
      seq->train(on);
    }
  }

  void PrepareData(const Dataset& d) {
    const auto bytes = [](const auto& v) {
      return std::string_view(reinterpret_cast<const char*>(v.data()),
                              v.size() * sizeof(v[0]));
    };
    const std::hash<std::string_view> hash;
    const size_t key = (((hash(bytes(d.bytes)) * 31 + hash(bytes(d.labels))) * 31 +
                         hash(bytes(d.mean))) * 31 + hash(bytes(d.stddev))) * 31 +
                       hash(bytes(d.targets));
    if (cached && cached_key == key) return;
    x = ExamplesToTensor(d);
    y = LabelsToTensor(d);
    if (d.type == ExampleType::kToken) {
      const int64_t length = x.size(1);
      y = x.slice(1, 1, length).contiguous();
      x = x.slice(1, 0, length - 1).contiguous();
    }
    t = d.targets.empty() ? torch::Tensor()
                          : torch::from_blob(const_cast<float*>(d.targets.data()), {d.size},
                                             torch::kFloat32).clone();
    cached_key = key;
    cached = true;
  }
};

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

StatusOr<std::unique_ptr<Model>> Model::Create(const ModelSpec& spec) {
  auto impl = std::make_unique<Impl>();
  try {
    if (spec.name == "torchscript") {
      std::istringstream in(spec.torchscript);
      impl->script = std::make_unique<torch::jit::Module>(torch::jit::load(in));
    } else {
      ASSIGN_OR_RETURN(impl->seq, BuildBuiltin(spec));
      impl->fast = FastTrainer::Compile(impl->seq);
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load model ", spec.name, ": ", e.what_without_backtrace()));
  }
  if (impl->NamedParameters().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, " has no parameters"));
  }
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

ParameterSet Model::Parameters() const {
  ParameterSet ps;
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : impl_->NamedParameters()) {
    auto c = t.detach().to(torch::kFloat32).contiguous();
    Tensor out;
    out.name = name;
    out.shape.assign(c.sizes().begin(), c.sizes().end());
    out.values.resize(c.numel());
    std::memcpy(out.values.data(), c.data_ptr<float>(), c.numel() * sizeof(float));
    ps.Add(std::move(out)).IgnoreError();  // names from torch are unique
  }
  return ps;
}

Status Model::SetParameters(const ParameterSet& params) {
  auto named = impl_->NamedParameters();
  if (named.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("model has ", named.size(),
                                                   " parameter tensors, got ", params.size()));
  }
  for (size_t i = 0; i < named.size(); ++i) {
    const Tensor& src = params.tensors()[i];
    const auto& dst = named[i].second;
    std::vector<int64_t> shape(dst.sizes().begin(), dst.sizes().end());
    if (src.name != named[i].first || src.shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", i, " (", named[i].first, ") does not match ", src.name));
    }
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < named.size(); ++i) {
    const Tensor& src = params.tensors()[i];
    auto dst = named[i].second;
    dst.copy_(torch::from_blob(const_cast<float*>(src.values.data()), dst.sizes(),
                               torch::kFloat32));
  }
  return absl::OkStatus();
}

Status Model::SetTorchScriptLoss(const std::string& archive) {
  try {
    std::istringstream in(archive);
    auto loss = std::make_unique<torch::jit::Module>(torch::jit::load(in));
    const auto forward = loss->find_method("forward");
    if (!forward || forward->function().getSchema().arguments().size() != 3) {
      return absl::InvalidArgumentError(
          "the TorchScript loss needs forward(self, output, target) returning a scalar");
    }
    loss->eval();
    impl_->loss_script = std::move(loss);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load the TorchScript loss: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

namespace {

// OK when `loss` is one of LossNames() and suits `data`: mse and mae need regression
// targets, the other built-in losses labels (a TorchScript loss takes either).
Status CheckLossSuitsData(const std::string& loss, const Dataset& data) {
  RETURN_IF_ERROR(LossNames().Check(loss));
  if (loss != "torchscript" && (loss == "mse" || loss == "mae") != !data.targets.empty()) {
    return absl::InvalidArgumentError("loss " + loss + " does not suit this data's labels");
  }
  return absl::OkStatus();
}

// The batch's `loss` of `out` against its labels `y` (int64) or targets `t` (float):
// the mean over the batch, or the sum when `sum`. `script` is the torchscript loss.
torch::Tensor Loss(const std::string& loss, torch::jit::Module* script, const torch::Tensor& out,
                   const torch::Tensor& y, const torch::Tensor& t, double label_smoothing,
                   bool sum = false) {
  namespace F = torch::nn::functional;
  if (loss == "torchscript") {
    TORCH_CHECK(script != nullptr, "no TorchScript loss loaded");
    auto mean = script->forward({out, t.defined() ? t : y}).toTensor();
    TORCH_CHECK(mean.numel() == 1 && mean.is_floating_point(),
                "the TorchScript loss must return a floating-point scalar, not a tensor of shape ",
                mean.sizes());
    return sum ? mean.reshape({}) * out.size(0) : mean.reshape({});
  }
  if (loss == "bce") {
    auto o = F::BinaryCrossEntropyWithLogitsFuncOptions();
    if (sum) o.reduction(torch::kSum);
    return F::binary_cross_entropy_with_logits(out.reshape({-1}), y.to(torch::kFloat32), o);
  }
  if (loss == "mse") {
    auto o = F::MSELossFuncOptions();
    if (sum) o.reduction(torch::kSum);
    return F::mse_loss(out.reshape({-1}), t, o);
  }
  if (loss == "mae") {
    auto o = F::L1LossFuncOptions();
    if (sum) o.reduction(torch::kSum);
    return F::l1_loss(out.reshape({-1}), t, o);
  }
  TORCH_CHECK(loss == "cross_entropy", "loss ", loss, " is in LossNames() but not implemented");
  auto o = F::CrossEntropyFuncOptions().label_smoothing(label_smoothing);
  if (sum) o.reduction(torch::kSum);
  if (out.dim() == 3) {  // next-token prediction: [n, T, vocab] against [n, T]
    return F::cross_entropy(out.reshape({-1, out.size(2)}), y.reshape({-1}), o);
  }
  return F::cross_entropy(out, y, o);
}

// One optimizer step on `params` with their accumulated gradients (which it zeroes), as
// torch.optim defines SGD, Adam and AdamW (models/optimizer_step.h), after the FedProx
// term and gradient clipping (torch.nn.utils.clip_grad_norm_). Fused per parameter.
class LocalOptimizer {
 public:
  LocalOptimizer(std::vector<torch::Tensor> params, const LocalTrainOptions& o)
      : params_(std::move(params)), o_(o) {
    for (auto& p : params_) {
      if (o.proximal_mu > 0) anchor_.push_back(p.detach().clone());
      first_.push_back(torch::zeros_like(p));
      second_.push_back(o.optimizer == "sgd" ? torch::Tensor() : torch::zeros_like(p));
    }
  }

  void Step() {
    torch::NoGradGuard no_grad;
    ++steps_;
    std::vector<torch::Tensor> grads(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      grads[i] = params_[i].mutable_grad();
      if (grads[i].defined() && o_.proximal_mu > 0) {
        grads[i].add_(params_[i] - anchor_[i], o_.proximal_mu);  // FedProx
      }
    }
    ClipGradNorm(grads, o_.clip_norm);
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!grads[i].defined()) continue;
      OptimizerStep(o_, steps_, params_[i], grads[i], first_[i], second_[i]);
      grads[i].zero_();  // ready for the next backward, instead of a separate zero_grad pass
    }
  }

 private:
  std::vector<torch::Tensor> params_, anchor_, first_, second_;
  const LocalTrainOptions& o_;
  int64_t steps_ = 0;
};

}  // namespace

StatusOr<TrainStats> Model::Train(const Dataset& data, const LocalTrainOptions& o) {
  if (data.size == 0) return absl::FailedPreconditionError("no training data");
  RETURN_IF_ERROR(OptimizerNames().Check(o.optimizer));
  RETURN_IF_ERROR(CheckLossSuitsData(o.loss, data));
  const auto start = std::chrono::steady_clock::now();
  TrainStats stats;
  try {
    impl_->PrepareData(data);
    std::vector<torch::Tensor> params;  // the trainable tensors (buffers have no gradient)
    for (auto& [name, t] : impl_->NamedParameters()) {
      if (t.requires_grad()) params.push_back(t);
    }
    LocalOptimizer optimizer(params, o);
    // FastTrainer's loss is plain cross-entropy.
    const bool fast = impl_->fast && o.loss == "cross_entropy" && o.label_smoothing == 0;
    impl_->SetTraining(true);
    auto gen = at::detail::createCPUGenerator(o.seed);
    const int64_t n = data.size;
    const int64_t total_steps = TaskSteps(o.local_steps, o.local_epochs, n, o.batch_size);
    int64_t steps = 0;
    double loss_sum = 0;
    int64_t loss_count = 0;
    while (steps < total_steps) {
      // Shuffle once per epoch; batches are then contiguous views, not gathers.
      auto perm = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kInt64));
      const auto xs = impl_->x.index_select(0, perm);
      const auto ys = impl_->y.index_select(0, perm);
      const auto ts = impl_->t.defined() ? impl_->t.index_select(0, perm) : torch::Tensor();
      loss_sum = 0;  // the loss reported is the last (possibly partial) epoch's
      loss_count = 0;
      for (int64_t b = 0; b < n && steps < total_steps; b += o.batch_size, ++steps) {
        if (o.cancel != nullptr && o.cancel->load()) {
          impl_->SetTraining(false);
          return absl::CancelledError("training cancelled");
        }
        const int64_t e = std::min(n, b + o.batch_size);
        auto xb = xs.slice(0, b, e);
        if (data.augment.enabled()) xb = Augment(xb, data.augment, gen);
        auto yb = ys.slice(0, b, e);
        double loss;
        if (fast) {
          loss = impl_->fast->ForwardBackward(xb, yb);
        } else {
          auto l = Loss(o.loss, impl_->loss_script.get(), impl_->Forward(xb), yb,
                        ts.defined() ? ts.slice(0, b, e) : ts, o.label_smoothing);
          l.backward();
          loss = l.item<double>();
        }
        loss_sum += loss * static_cast<double>(e - b);
        loss_count += e - b;
        optimizer.Step();
      }
    }
    stats.loss = loss_sum / std::max<int64_t>(1, loss_count);
    impl_->SetTraining(false);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("training failed: ", e.what_without_backtrace()));
  }
  if (!std::isfinite(stats.loss)) {
    return absl::InternalError("training diverged (non-finite loss); lower train.lr");
  }
  stats.examples = data.size;
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

StatusOr<EvalStats> Model::Evaluate(const Dataset& data, int batch_size,
                                    const std::string& loss) const {
  if (data.size == 0) return absl::FailedPreconditionError("no evaluation data");
  RETURN_IF_ERROR(CheckLossSuitsData(loss, data));
  const bool regression = !data.targets.empty();
  const bool text = data.type == ExampleType::kToken;
  EvalStats s;
  try {
    torch::NoGradGuard no_grad;
    impl_->PrepareData(data);
    impl_->SetTraining(false);
    double loss_sum = 0, abs_sum = 0, sq_sum = 0;
    int64_t correct = 0, top5 = 0, tp = 0, fp = 0, fn = 0, tokens = 0;
    bool binary_task = false;
    std::vector<int64_t> class_correct, class_total;
    for (int64_t b = 0; b < data.size; b += batch_size) {
      const int64_t e = std::min(data.size, b + batch_size);
      auto out = impl_->Forward(impl_->x.slice(0, b, e));
      auto yb = impl_->y.slice(0, b, e);
      auto tb = regression ? impl_->t.slice(0, b, e) : torch::Tensor();
      loss_sum += Loss(loss, impl_->loss_script.get(), out, yb, tb, 0, /*sum=*/true).item<double>();
      if (text) {  // next-token prediction: every position counts
        TORCH_CHECK(out.dim() == 3, "text needs outputs of shape [N, T, vocab], not ", out.sizes());
        correct += out.argmax(2).eq(yb).sum().item<int64_t>();
        tokens += yb.numel();
        continue;
      }
      // A TorchScript loss's task follows from the data and the model's outputs.
      const bool binary = !regression && (loss == "bce" || (loss == "torchscript" && out.dim() <= 2 &&
                                                            out.numel() == out.size(0)));
      if (regression) {
        TORCH_CHECK(out.numel() == tb.numel(), "regression needs one output per example, not ",
                    out.sizes());
        auto err = out.reshape({-1}) - tb;
        abs_sum += err.abs().sum().item<double>();
        sq_sum += (err * err).sum().item<double>();
      } else if (binary) {
        binary_task = true;
        auto pred = out.reshape({-1}).gt(0).to(torch::kInt64);
        correct += pred.eq(yb).sum().item<int64_t>();
        tp += (pred * yb).sum().item<int64_t>();
        fp += (pred * (1 - yb)).sum().item<int64_t>();
        fn += ((1 - pred) * yb).sum().item<int64_t>();
      } else {
        TORCH_CHECK(out.dim() == 2, "classification needs outputs of shape [N, classes], not ",
                    out.sizes());
        auto pred = out.argmax(1);
        auto hit = pred.eq(yb);
        correct += hit.sum().item<int64_t>();
        const int64_t classes = out.size(1);
        if (classes >= 5) {
          top5 += std::get<1>(out.topk(5, 1)).eq(yb.unsqueeze(1)).any(1).sum().item<int64_t>();
        }
        class_total.resize(classes);
        class_correct.resize(classes);
        auto totals = torch::bincount(yb, {}, classes);
        auto hits = torch::bincount(yb.masked_select(hit), {}, classes);
        for (int64_t c = 0; c < classes; ++c) {
          class_total[c] += totals[c].item<int64_t>();
          class_correct[c] += hits[c].item<int64_t>();
        }
      }
    }
    const double n = static_cast<double>(data.size);
    s.examples = data.size;
    s.loss = loss_sum / n;
    if (text) {  // the loss and accuracy per token; perplexity; bits per byte of text
      s.loss = loss_sum / static_cast<double>(tokens);
      s.accuracy = static_cast<double>(correct) / static_cast<double>(tokens);
      s.metrics["perplexity"] = std::exp(s.loss);
      s.metrics["bits_per_byte"] =
          s.loss / std::log(2.0) / (data.bytes_per_token > 0 ? data.bytes_per_token : 1);
      s.metrics["tokens"] = static_cast<double>(tokens);
      return s;
    }
    if (regression) {
      s.metrics["mae"] = abs_sum / n;
      s.metrics["rmse"] = std::sqrt(sq_sum / n);
    } else {
      s.accuracy = correct / n;
    }
    if (binary_task) {
      const double precision = tp + fp > 0 ? double(tp) / (tp + fp) : 0;
      const double recall = tp + fn > 0 ? double(tp) / (tp + fn) : 0;
      s.metrics["precision"] = precision;
      s.metrics["recall"] = recall;
      s.metrics["f1"] = precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0;
    }
    if (!regression && !binary_task) {
      if (class_total.size() >= 5) s.metrics["top5_accuracy"] = top5 / n;
      for (size_t c = 0; c < class_total.size(); ++c) {
        s.per_class_accuracy.push_back(class_total[c] > 0 ? double(class_correct[c]) / class_total[c]
                                                          : std::nan(""));
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("evaluation failed: ", e.what_without_backtrace()));
  }
  return s;
}

namespace {

// The context and vocabulary of a language model's embedding stage; FAILED_PRECONDITION
// for other models.
StatusOr<std::pair<int64_t, int64_t>> TextModelSizes(const nn::Sequential& seq) {
  if (seq.is_empty() || seq->size() < 2) {
    return absl::FailedPreconditionError("only a language model (model gpt) reads token ids");
  }
  const auto named = seq->ptr(0)->named_parameters();
  if (!named.contains("wpe.weight") || !named.contains("wte.weight")) {
    return absl::FailedPreconditionError("only a language model (model gpt) reads token ids");
  }
  return std::make_pair(named["wpe.weight"].size(0), named["wte.weight"].size(0));
}

Status CheckIds(const std::vector<int32_t>& ids, int64_t vocab, const char* what) {
  if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat("the ", what, " is empty"));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(what, " token ", i, " is id ", ids[i],
                                                     ", outside the vocabulary [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

StatusOr<std::vector<float>> Model::Logits(const std::vector<int32_t>& ids) {
  ASSIGN_OR_RETURN(auto sizes, TextModelSizes(impl_->seq));
  RETURN_IF_ERROR(CheckIds(ids, sizes.second, "input"));
  if (static_cast<int64_t>(ids.size()) > sizes.first) {
    return absl::InvalidArgumentError(absl::StrCat(ids.size(), " tokens exceed the context of ",
                                                   sizes.first));
  }
  try {
    torch::NoGradGuard no_grad;
    impl_->SetTraining(false);
    auto x = torch::tensor(std::vector<int64_t>(ids.begin(), ids.end())).unsqueeze(0);
    auto out = impl_->Forward(x).contiguous();
    return std::vector<float>(out.data_ptr<float>(), out.data_ptr<float>() + out.numel());
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("forward failed: ", e.what_without_backtrace()));
  }
}

StatusOr<std::vector<int32_t>> Model::Generate(const std::vector<int32_t>& prompt, int tokens,
                                               double temperature, int top_k, uint64_t seed) {
  ASSIGN_OR_RETURN(auto sizes, TextModelSizes(impl_->seq));
  const auto [context, vocab] = sizes;
  RETURN_IF_ERROR(CheckIds(prompt, vocab, "prompt"));
  std::vector<int32_t> out;
  try {
    torch::NoGradGuard no_grad;
    impl_->SetTraining(false);
    auto gen = at::detail::createCPUGenerator(seed);
    std::vector<int64_t> ids(prompt.begin(), prompt.end());
    for (int i = 0; i < tokens; ++i) {
      const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - context);
      auto x = torch::tensor(std::vector<int64_t>(ids.begin() + start, ids.end())).unsqueeze(0);
      auto logits = impl_->Forward(x)[0][-1];
      int64_t next;
      if (temperature <= 0) {
        next = logits.argmax().item<int64_t>();
      } else {
        logits = logits / temperature;
        if (top_k > 0 && top_k < vocab) {
          const auto kth = std::get<0>(logits.topk(top_k))[-1];
          logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
        }
        next = torch::multinomial(torch::softmax(logits, 0), 1, false, gen).item<int64_t>();
      }
      ids.push_back(next);
      out.push_back(static_cast<int32_t>(next));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("generation failed: ", e.what_without_backtrace()));
  }
  return out;
}

std::vector<std::string> Model::FrozenTensors() const {
  std::vector<std::string> out;
  if (impl_->script) return out;
  for (const auto& p : impl_->seq->named_parameters(/*recurse=*/true)) {
    if (!p.value().requires_grad()) out.push_back(p.key());
  }
  return out;
}

int Model::num_stages() const {
  if (impl_->script) {
    int n = 0;
    for (const auto& c : impl_->script->children()) {
      (void)c;
      ++n;
    }
    return n;
  }
  return static_cast<int>(impl_->seq->size());
}

namespace {

Status CheckTextFitsModel(const Dataset& data, const ModelSpec& spec, const std::string& loss,
                          const std::string& what) {
  if (spec.name != "gpt") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": text needs a language model (model.name: gpt), not ", spec.name));
  }
  if (loss != "cross_entropy") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": text trains with loss cross_entropy (next token), not ", loss));
  }
  if (data.num_classes != spec.gpt.vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the tokenizer ", data.tokenizer, " has a vocabulary of ", data.num_classes,
        " but the model's is ", spec.gpt.vocab, " (model.gpt.vocab)"));
  }
  const int64_t length = data.shape.empty() ? 0 : data.shape[0] - 1;
  if (length < 1 || length > spec.gpt.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": sequences of ", length, " tokens do not fit the model's context of ",
        spec.gpt.context, " (the data's context= or model.gpt.context)"));
  }
  for (int64_t i = 0; i < data.size; ++i) {
    for (int64_t j = 0; j < data.example_elements(); ++j) {
      const int32_t id = data.token(i, j);
      if (id < 0 || id >= spec.gpt.vocab) {
        return absl::InvalidArgumentError(absl::StrCat(what, ": sequence ", i, " token ", j, " is id ",
                                                       id, ", outside the vocabulary [0, ",
                                                       spec.gpt.vocab, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

Status CheckDataFitsModel(const Dataset& data, const ModelSpec& spec, const std::string& loss,
                          const std::string& what) {
  if (data.type == ExampleType::kToken) return CheckTextFitsModel(data, spec, loss, what);
  if (spec.name == "gpt") {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": model gpt needs text (a text:PATH data spec)"));
  }
  if (data.shape != spec.input_shape) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": examples are ", absl::StrJoin(data.shape, "x"), " but the model takes ",
                     absl::StrJoin(spec.input_shape, "x"), " (model.input; resize with the data "
                     "spec's size=HxW and channels=)"));
  }
  const bool regression = loss == "mse" || loss == "mae";
  if (loss != "torchscript" && regression != !data.targets.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, regression ? ": loss " + loss + " needs regression targets (a table's `regression` option)"
                         : ": regression targets need loss mse or mae, not " + loss));
  }
  if (loss != "cross_entropy" && loss != "torchscript" && spec.num_classes != 1) {
    return absl::InvalidArgumentError(absl::StrCat("loss ", loss, " needs a model with one output "
                                                   "(model.classes: 1), not ", spec.num_classes));
  }
  int64_t max_label = -1;
  for (int64_t l : data.labels) max_label = std::max(max_label, l);
  if (loss == "bce" && max_label > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": label ", max_label, " but loss bce takes labels 0 and 1"));
  }
  // Class labels (a TorchScript loss's too, for a model with several outputs).
  const bool classes = loss == "cross_entropy" ||
                       (loss == "torchscript" && data.targets.empty() && spec.num_classes > 1);
  if (classes && max_label >= spec.num_classes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": label ", max_label,
                                                   " but the model has ", spec.num_classes,
                                                   " classes (model.classes)"));
  }
  return absl::OkStatus();
}

ModelSpec ModelSpecOf(const JobConfig& c) {
  const ModelConfig& m = c.model;
  return {m.name, "", c.run.seed, m.input, m.classes, m.gpt, m.lora};
}

std::vector<std::string> BuiltinModelNames() {
  std::vector<std::string> names;
  for (const Builtin& b : kBuiltins) names.push_back(b.name);
  return names;
}

StatusOr<std::vector<TorchStage>> BuildTorchStages(const ModelSpec& spec) {
  std::vector<TorchStage> stages;
  try {
    if (spec.name == "torchscript") {
      std::istringstream in(spec.torchscript);
      torch::jit::Module script = torch::jit::load(in);
      for (const auto& child : script.named_children()) {
        torch::jit::Module m = child.value;
        const std::string prefix = child.name + ".";
        TorchStage s;
        s.parameters = [m, prefix] {
          std::vector<std::pair<std::string, torch::Tensor>> out;
          for (const auto& p : m.named_parameters(/*recurse=*/true)) {
            out.emplace_back(prefix + p.name, p.value);
          }
          for (const auto& b : m.named_buffers(/*recurse=*/true)) {
            if (b.value.is_floating_point()) out.emplace_back(prefix + b.name, b.value);
          }
          return out;
        };
        s.forward = [m](const torch::Tensor& x) mutable { return m.forward({x}).toTensor(); };
        s.train = [m](bool on) mutable { m.train(on); };
        stages.push_back(std::move(s));
      }
    } else {
      ASSIGN_OR_RETURN(nn::Sequential seq, BuildBuiltin(spec));
      for (size_t i = 0; i < seq->size(); ++i) {
        nn::AnyModule stage = *(seq->begin() + i);  // a Stage, or a module of the decoder
        const std::string prefix = absl::StrCat(i, ".");
        TorchStage s;
        s.parameters = [stage, prefix] {
          std::vector<std::pair<std::string, torch::Tensor>> out;
          for (const auto& p : stage.ptr()->named_parameters(/*recurse=*/true)) {
            out.emplace_back(prefix + p.key(), p.value());
          }
          AppendFloatBuffers(stage.ptr()->named_buffers(/*recurse=*/true), prefix, out);
          return out;
        };
        s.forward = [stage](const torch::Tensor& x) mutable {
          return stage.forward<torch::Tensor>(x);
        };
        s.train = [stage](bool on) { stage.ptr()->train(on); };
        stages.push_back(std::move(s));
      }
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load model ", spec.name, ": ", e.what_without_backtrace()));
  }
  if (stages.empty()) return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, " has no stages"));
  return stages;
}

namespace {
std::atomic<int> g_torch_threads{0};  // SetTorchThreads' value; 0 = not set
}  // namespace

void UseTorchThreads() {
  const int n = g_torch_threads.load();
  if (n > 0) at::set_num_threads(n);  // in an OpenMP build: this thread's team size
}

void SetTorchThreads(int threads) {
  g_torch_threads = threads;
  at::set_num_threads(threads);
  // LibTorch's BLAS here is OpenBLAS with its own thread pool, which
  // at::set_num_threads does not reach; its idle threads spin and steal the core.
  using SetBlasThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetBlasThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    f(threads);
  }
  try {
    at::set_num_interop_threads(threads);
  } catch (const c10::Error&) {
    // Only settable once per process, before inter-op work starts; keep what is set.
  }
}

}  // namespace cleave
