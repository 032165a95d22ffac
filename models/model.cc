#include "models/model.h"

#include <torch/script.h>
#include <torch/torch.h>

#include <dlfcn.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <sstream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "models/fast_trainer.h"
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

nn::Sequential BuildMlp() {
  return nn::Sequential(Stage(nn::Flatten(), nn::Linear(784, 200), nn::ReLU()),
                        Stage(nn::Linear(200, 200), nn::ReLU()),
                        Stage(nn::Linear(200, 10)));
}

nn::Sequential BuildLeNet5() {
  return nn::Sequential(Stage(nn::Conv2d(nn::Conv2dOptions(1, 6, 5)), ReluMaxPool()),
                        Stage(nn::Conv2d(nn::Conv2dOptions(6, 16, 5)), ReluMaxPool()),
                        Stage(nn::Flatten(), nn::Linear(256, 120), nn::ReLU()),
                        Stage(nn::Linear(120, 84), nn::ReLU()),
                        Stage(nn::Linear(84, 10)));
}

// A VGG-style network for 28x28 inputs with nine stages, so that where it is cut matters
// for split learning: activation sizes and per-stage compute differ widely.
nn::Sequential BuildVgg() {
  auto conv = [](int in, int out) { return nn::Conv2d(nn::Conv2dOptions(in, out, 3).padding(1)); };
  nn::Sequential seq(Stage(conv(1, 8), nn::ReLU()),         // 8x28x28
                     Stage(conv(8, 16), ReluMaxPool()),     // 16x14x14
                     Stage(conv(16, 32), nn::ReLU()),       // 32x14x14
                     Stage(conv(32, 32), ReluMaxPool()),    // 32x7x7
                     Stage(conv(32, 64), nn::ReLU()),       // 64x7x7
                     Stage(conv(64, 64), ReluMaxPool()),    // 64x3x3
                     Stage(nn::Flatten(), nn::Linear(576, 256), nn::ReLU()),
                     Stage(nn::Linear(256, 128), nn::ReLU()),
                     Stage(nn::Linear(128, 10)));
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

nn::Sequential BuildCnn() {
  return nn::Sequential(Stage(nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)), ReluMaxPool()),
                        Stage(nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)), ReluMaxPool()),
                        Stage(nn::Flatten(), nn::Linear(3136, 128), nn::ReLU()),
                        Stage(nn::Linear(128, 10)));
}

// Pixels to a normalised float tensor [n, c, h, w].
torch::Tensor ImagesToTensor(const Dataset& d) {
  auto u8 = torch::from_blob(const_cast<uint8_t*>(d.images.data()),
                             {d.size, d.channels, d.height, d.width}, torch::kUInt8);
  return ((u8.to(torch::kFloat32) / 255.0f) - d.mean) / d.stddev;
}

torch::Tensor LabelsToTensor(const Dataset& d) {
  return torch::from_blob(const_cast<int64_t*>(d.labels.data()), {d.size}, torch::kInt64)
      .clone();
}

// The built-in model `name`; nullptr-holder for an unknown name.
nn::Sequential BuildBuiltin(const std::string& name) {
  if (name == "mlp") return BuildMlp();
  if (name == "lenet5") return BuildLeNet5();
  if (name == "cnn") return BuildCnn();
  if (name == "vgg") return BuildVgg();
  return nn::Sequential(nullptr);
}

}  // namespace

struct Model::Impl {
  nn::Sequential seq{nullptr};                  // built-in models
  std::unique_ptr<FastTrainer> fast;            // seq's training step without autograd
  std::unique_ptr<torch::jit::Module> script;   // TorchScript models

  // Cached tensors of the last dataset seen (clients train on one dataset all run long),
  // keyed by its contents: a dataset at the address of an earlier one (a temporary
  // subset, say) is not mistaken for it.
  size_t cached_key = 0;
  bool cached = false;
  torch::Tensor x, y;

  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() const {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    if (script) {
      for (const auto& p : script->named_parameters(/*recurse=*/true)) {
        out.emplace_back(p.name, p.value);
      }
    } else {
      for (const auto& p : seq->named_parameters(/*recurse=*/true)) {
        out.emplace_back(p.key(), p.value());
      }
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
    const size_t key = std::hash<std::string_view>{}(bytes(d.images)) * 31 +
                       std::hash<std::string_view>{}(bytes(d.labels));
    if (cached && cached_key == key) return;
    x = ImagesToTensor(d);
    y = LabelsToTensor(d);
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
      torch::manual_seed(spec.seed);
      impl->seq = BuildBuiltin(spec.name);
      if (!impl->seq) {
        return absl::InvalidArgumentError(absl::StrCat("unknown model '", spec.name, "'"));
      }
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

StatusOr<TrainStats> Model::Train(const Dataset& data, const LocalTrainOptions& o) {
  if (data.size == 0) return absl::FailedPreconditionError("no training data");
  const auto start = std::chrono::steady_clock::now();
  TrainStats stats;
  try {
    impl_->PrepareData(data);
    std::vector<torch::Tensor> params;
    for (auto& [name, t] : impl_->NamedParameters()) params.push_back(t);
    std::vector<torch::Tensor> anchor;
    if (o.proximal_mu > 0) {
      for (auto& p : params) anchor.push_back(p.detach().clone());
    }
    // SGD with momentum and weight decay, as torch.optim.SGD defines it (no dampening,
    // no Nesterov; a zero buffer makes the first step buf = d_p), fused per parameter.
    std::vector<torch::Tensor> momentum_buf;
    for (auto& p : params) momentum_buf.push_back(torch::zeros_like(p));
    auto sgd_step = [&] {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        auto g = params[i].mutable_grad();
        if (!g.defined()) continue;
        if (o.proximal_mu > 0) g.add_(params[i] - anchor[i], o.proximal_mu);  // FedProx
        if (o.weight_decay != 0) g.add_(params[i], o.weight_decay);
        if (o.momentum != 0) {
          momentum_buf[i].mul_(o.momentum).add_(g);
          params[i].add_(momentum_buf[i], -o.lr);
        } else {
          params[i].add_(g, -o.lr);
        }
        g.zero_();  // ready for the next backward, instead of a separate zero_grad pass
      }
    };
    impl_->SetTraining(true);
    auto gen = at::detail::createCPUGenerator(o.seed);
    const int64_t n = data.size;
    for (int epoch = 0; epoch < o.epochs; ++epoch) {
      // Shuffle once per epoch; batches are then contiguous views, not gathers.
      auto perm = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kInt64));
      const auto xs = impl_->x.index_select(0, perm);
      const auto ys = impl_->y.index_select(0, perm);
      double loss_sum = 0;
      for (int64_t b = 0; b < n; b += o.batch_size) {
        if (o.cancel != nullptr && o.cancel->load()) {
          impl_->SetTraining(false);
          return absl::CancelledError("training cancelled");
        }
        const int64_t e = std::min(n, b + o.batch_size);
        auto xb = xs.slice(0, b, e);
        auto yb = ys.slice(0, b, e);
        double loss;
        if (impl_->fast) {
          loss = impl_->fast->ForwardBackward(xb, yb);
        } else {
          auto l = torch::nn::functional::cross_entropy(impl_->Forward(xb), yb);
          l.backward();
          loss = l.item<double>();
        }
        loss_sum += loss * static_cast<double>(e - b);
        sgd_step();
      }
      stats.loss = loss_sum / n;
    }
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

StatusOr<EvalStats> Model::Evaluate(const Dataset& data, int batch_size) const {
  if (data.size == 0) return absl::FailedPreconditionError("no evaluation data");
  EvalStats s;
  try {
    torch::NoGradGuard no_grad;
    impl_->PrepareData(data);
    impl_->SetTraining(false);
    int64_t correct = 0;
    double loss_sum = 0;
    for (int64_t b = 0; b < data.size; b += batch_size) {
      const int64_t e = std::min(data.size, b + batch_size);
      auto logits = impl_->Forward(impl_->x.slice(0, b, e));
      auto yb = impl_->y.slice(0, b, e);
      loss_sum += torch::nn::functional::cross_entropy(
                      logits, yb,
                      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                      .item<double>();
      correct += logits.argmax(1).eq(yb).sum().item<int64_t>();
    }
    s.examples = data.size;
    s.accuracy = static_cast<double>(correct) / data.size;
    s.loss = loss_sum / data.size;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("evaluation failed: ", e.what_without_backtrace()));
  }
  return s;
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
          return out;
        };
        s.forward = [m](const torch::Tensor& x) mutable { return m.forward({x}).toTensor(); };
        s.train = [m](bool on) mutable { m.train(on); };
        stages.push_back(std::move(s));
      }
    } else {
      torch::manual_seed(spec.seed);
      nn::Sequential seq = BuildBuiltin(spec.name);
      if (!seq) return absl::InvalidArgumentError(absl::StrCat("unknown model '", spec.name, "'"));
      for (size_t i = 0; i < seq->size(); ++i) {
        auto stage = std::dynamic_pointer_cast<StageImpl>(seq->ptr(i));
        const std::string prefix = absl::StrCat(i, ".");
        TorchStage s;
        s.parameters = [stage, prefix] {
          std::vector<std::pair<std::string, torch::Tensor>> out;
          for (const auto& p : stage->named_parameters(/*recurse=*/true)) {
            out.emplace_back(prefix + p.key(), p.value());
          }
          return out;
        };
        s.forward = [stage](const torch::Tensor& x) { return stage->forward(x); };
        s.train = [stage](bool on) { stage->train(on); };
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

void SetTorchThreads(int threads) {
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
