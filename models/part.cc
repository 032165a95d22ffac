#include "models/part.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "models/hf_folder.h"
#include "models/optimizer_step.h"
#include "models/optimizers.h"
#include "models/torch_stages.h"


namespace cleave {
namespace {

// The bytes of tensors the calling thread holds, counted from when it is made: LibTorch's
// CPU allocator reports each allocation and free to the thread's memory reporter (the
// profiler's hook, c10::MemoryReportingInfoBase), so what other threads allocate, a
// simulation's other clients training say, does not count.
class ThreadTensorBytes : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void* /*ptr*/, int64_t size, int64_t /*total_allocated*/, int64_t /*total_reserved*/,
                         c10::Device /*device*/) override {
    held_ += size;
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t held() const { return held_; }

 private:
  int64_t held_ = 0;
};

torch::Tensor ToTensor(const Activations& a) {
  return torch::from_blob(const_cast<float*>(a.values.data()), a.shape, torch::kFloat32).clone();
}

Activations FromTensor(const torch::Tensor& t) {
  auto c = t.detach().contiguous();
  Activations a;
  a.shape.assign(c.sizes().begin(), c.sizes().end());
  a.values.resize(c.numel());
  std::memcpy(a.values.data(), c.data_ptr<float>(), c.numel() * sizeof(float));
  return a;
}

Status CheckActivations(const Activations& a) {
  if (a.shape.empty() || NumElements(a.shape) != static_cast<int64_t>(a.values.size())) {
    return absl::InvalidArgumentError("activations: shape and value count disagree");
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int64_t> BatchLabels(const Dataset& data, const std::vector<int64_t>& indices, int64_t length) {
  std::vector<int64_t> labels;
  if (data.type != ExampleType::kToken) {
    for (int64_t i : indices) labels.push_back(data.labels[i]);
    return labels;
  }
  const int64_t n = length > 0 ? std::min(length + 1, data.example_elements()) : data.example_elements();
  for (int64_t i : indices) {
    for (int64_t j = 1; j < n; ++j) labels.push_back(data.target(i, j));
  }
  return labels;
}

Activations InputBatch(const Dataset& data, const std::vector<int64_t>& indices, int64_t length) {
  Activations a;
  a.shape = {static_cast<int64_t>(indices.size())};
  a.shape.insert(a.shape.end(), data.shape.begin(), data.shape.end());
  const int64_t n = data.example_elements();
  // Text: a language model reads each sequence but its last token (as floats).
  int64_t kept = data.type == ExampleType::kToken ? n - 1 : n;
  if (data.type == ExampleType::kToken && length > 0) kept = std::min(kept, length);
  if (data.type == ExampleType::kToken) a.shape.back() = kept;
  a.values.resize(indices.size() * kept);
  std::vector<float> example(n);
  float* out = a.values.data();
  for (int64_t i : indices) {
    data.Normalised(i, example.data());
    std::copy(example.begin(), example.begin() + kept, out);
    out += kept;
  }
  return a;
}

namespace {

// Double-centred pairwise distances of the rows of x (flattened per row).
torch::Tensor CentredDistances(const torch::Tensor& x) {
  auto f = x.reshape({x.size(0), -1});
  auto sq = (f * f).sum(1, true);
  auto d2 = (sq + sq.t() - 2 * f.matmul(f.t())).clamp_min(1e-12);
  auto d = d2.sqrt();
  return d - d.mean(0, true) - d.mean(1, true) + d.mean();
}

// Sample distance correlation (Székely et al. 2007), differentiable in both arguments.
torch::Tensor DistanceCorrelationTensor(const torch::Tensor& x, const torch::Tensor& z) {
  auto a = CentredDistances(x), b = CentredDistances(z);
  auto dcov_xz = (a * b).mean(), dcov_xx = (a * a).mean(), dcov_zz = (b * b).mean();
  return (dcov_xz.clamp_min(0) / (dcov_xx * dcov_zz).sqrt().clamp_min(1e-12)).sqrt();
}

}  // namespace

struct ModelPart::Impl {
  std::vector<TorchStage> stages;  // [begin, end) only
  int begin = 0, end = 0;
  std::string model;  // ModelSpec::name
  int layers = 0;     // ModelSpec::gpt.layers
  std::vector<std::pair<std::string, torch::Tensor>> params;
  std::vector<size_t> first_param;  // per stage: index of its first tensor in params
  // Optimizer state per tensor of params: momentum / first moment, second moment, steps.
  // Allocated by ResetOptimizer for trainable tensors only, and only what the optimizer
  // uses (none for plain SGD, one for momentum, two for Adam): frozen base weights under
  // LoRA cost their values and nothing more.
  std::vector<torch::Tensor> first, second;
  std::vector<int64_t> steps;
  LocalTrainOptions training;  // ResetOptimizer's
  const OptimizerKind* optimizer = nullptr;  // training.optimizer's
  struct Pending {
    torch::Tensor input, output;
    int from = 0;
    // The trainable weights its forward pass used, saved when a step changes them before
    // its backward pass (weight stashing; undefined for frozen ones); empty while they
    // are still the live weights.
    std::vector<torch::Tensor> stash;
  };
  std::map<int64_t, Pending> pending;
  double nopeek = 0;
  int accumulate = 0;  // SetAccumulate's: > 0, no step until Step()

  StatusOr<int> From(int from) const {
    if (from < 0) return begin;
    if (from < begin || from >= end) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", from, " is not in this part [", begin, ", ", end, ")"));
    }
    return from;
  }

  // The stages' quantized weights, in order.
  std::vector<std::pair<std::string, QuantizedWeight*>> Quantized() const {
    std::vector<std::pair<std::string, QuantizedWeight*>> all;
    for (const auto& s : stages) {
      auto q = s.quantized();
      all.insert(all.end(), q.begin(), q.end());
    }
    return all;
  }

  torch::Tensor Run(torch::Tensor x, int from) const {
    for (int i = from; i < end; ++i) x = stages[i - begin].forward(x);
    return x;
  }

  // One optimizer step with the accumulated gradients of the stages from `from` on,
  // which it then zeroes. Updates go through .data(), which has its own version counter,
  // so the graphs of micro-batches still pending stay usable (they see the new weights).
  void Step(int from) {
    torch::NoGradGuard no_grad;
    for (auto& [id, p] : pending) {  // keep what their forward passes saw
      if (!p.stash.empty()) continue;
      for (auto& [name, t] : params) {
        p.stash.push_back(t.requires_grad() ? t.detach().clone() : torch::Tensor());
      }
    }
    const size_t first_index = first_param[from - begin];
    std::vector<torch::Tensor> grads;
    for (size_t i = first_index; i < params.size(); ++i) grads.push_back(params[i].second.mutable_grad());
    ClipGradNorm(grads, training.clip_norm);
    for (size_t i = first_index; i < params.size(); ++i) {
      auto& g = grads[i - first_index];
      if (!g.defined()) continue;
      optimizer->step(training, ++steps[i], params[i].second.data(), g, first[i], second[i]);
      g.zero_();
    }
  }

  // Drops every gradient the last backward pass left (no step).
  void ZeroGrads() {
    for (auto& [name, t] : params) {
      if (t.grad().defined()) t.mutable_grad().zero_();
    }
  }

  static torch::Tensor Input(const Activations& in, int from) {
    auto x = ToTensor(in);
    if (from > 0) x.requires_grad_(true);
    return x;
  }

  static Activations InputGrad(const torch::Tensor& x) {
    if (!x.requires_grad() || !x.grad().defined()) return {};
    return FromTensor(x.grad());
  }
};

ModelPart::ModelPart(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ModelPart::~ModelPart() = default;

StatusOr<std::unique_ptr<ModelPart>> ModelPart::Create(const ModelSpec& spec, int begin,
                                                       int end) {
  ASSIGN_OR_RETURN(std::vector<TorchStage> all, BuildTorchStages(spec, begin, end));
  const int n = static_cast<int>(all.size());
  if (begin < 0 || begin >= end || end > n) {
    return absl::InvalidArgumentError(absl::StrCat("stages [", begin, ", ", end, ") of model ",
                                                   spec.name, ", which has ", n, " stages"));
  }
  auto impl = std::make_unique<Impl>();
  impl->begin = begin;
  impl->end = end;
  impl->model = spec.name;
  impl->layers = spec.gpt.layers;
  // Keep only this part's stages: the others' parameters are freed (unless TorchScript
  // keeps them alive in its module tree).
  impl->stages.assign(std::make_move_iterator(all.begin() + begin),
                      std::make_move_iterator(all.begin() + end));
  std::set<std::string> names;  // a tied head's weight is listed by stage 0 and the head
  for (auto& s : impl->stages) {
    impl->first_param.push_back(impl->params.size());
    for (auto& p : s.parameters()) {
      if (names.insert(p.first).second) impl->params.push_back(std::move(p));
    }
    s.train(true);
  }
  impl->first.resize(impl->params.size());
  impl->second.resize(impl->params.size());
  impl->steps.assign(impl->params.size(), 0);
  return std::unique_ptr<ModelPart>(new ModelPart(std::move(impl)));
}

QuantizedSet ModelPart::QuantizedBase() const { return QuantizedSetOf(impl_->Quantized()); }

Status ModelPart::LoadQuantized(const QuantizedSet& set) {
  return LoadQuantizedWeights(impl_->Quantized(), set);
}

int ModelPart::begin() const { return impl_->begin; }
int ModelPart::end() const { return impl_->end; }
size_t ModelPart::pending() const { return impl_->pending.size(); }

void ModelPart::SetAccumulate(int micro_batches) { impl_->accumulate = std::max(0, micro_batches); }

Status ModelPart::Step() {
  if (!impl_->pending.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(impl_->pending.size(), " micro-batches are still pending"));
  }
  try {
    impl_->Step(impl_->begin);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("step failed: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

int64_t ModelPart::OptimizerStateElements() const {
  int64_t n = 0;
  for (size_t i = 0; i < impl_->params.size(); ++i) {
    if (impl_->first[i].defined()) n += impl_->first[i].numel();
    if (impl_->second[i].defined()) n += impl_->second[i].numel();
  }
  return n;
}

std::vector<std::string> ModelPart::TensorNames() const {
  std::vector<std::string> out;
  for (const auto& [name, p] : impl_->params) out.push_back(name);
  return out;
}

ParameterSet ModelPart::Parameters() const {
  ParameterSet ps;
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : impl_->params) {
    auto c = p.detach().contiguous();
    Tensor t;
    t.name = name;
    t.shape.assign(c.sizes().begin(), c.sizes().end());
    t.values.resize(c.numel());
    std::memcpy(t.values.data(), c.data_ptr<float>(), c.numel() * sizeof(float));
    ps.Add(std::move(t)).IgnoreError();  // names are unique
  }
  return ps;
}

Status ModelPart::LoadFrom(const ParameterSet& params, bool partial) {
  return LoadFrom(ViewsOf(params), partial);
}

Status ModelPart::LoadFrom(const std::vector<TensorView>& views, bool partial) {
  std::map<std::string_view, const TensorView*> by_name;
  for (const TensorView& v : views) by_name[v.name] = &v;
  auto find = [&by_name](const std::string& name) -> const TensorView* {
    auto it = by_name.find(name);
    return it == by_name.end() ? nullptr : it->second;
  };
  for (const auto& [name, p] : impl_->params) {
    const TensorView* src = find(name);
    std::vector<int64_t> shape(p.sizes().begin(), p.sizes().end());
    if (src == nullptr ? !partial : src->shape != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", name, src == nullptr ? " is missing" : " has another shape"));
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : impl_->params) {
    const TensorView* src = find(name);
    if (src == nullptr) continue;
    auto dst = p.data();  // contiguous: the part's own tensors
    src->Read(0, src->numel, dst.data_ptr<float>());
  }
  return absl::OkStatus();
}

Status ModelPart::LoadBase(const ParameterSet& base) {
  for (const auto& [name, p] : impl_->params) {
    const Tensor* src = base.Find(name);
    if (src != nullptr && src->shape != std::vector<int64_t>(p.sizes().begin(), p.sizes().end())) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", name, " has another shape in the base"));
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : impl_->params) {
    const Tensor* src = base.Find(name);
    if (src == nullptr) continue;
    auto values = torch::from_blob(const_cast<float*>(src->values.data()), p.sizes(), torch::kFloat32);
    if (p.requires_grad()) {
      p.data().copy_(values);
    } else {
      p.set_data(values);  // the base's memory: the part's own copy is freed
    }
  }
  return absl::OkStatus();
}

Status ModelPart::LoadHfFolder(const std::string& dir) {
  if (impl_->model != "hf") return absl::FailedPreconditionError("only model hf is read from a folder");
  std::vector<HfTarget> targets;
  for (auto& [name, p] : impl_->params) {
    if (name.find(".lora_") != std::string::npos) continue;
    targets.push_back({name, std::vector<int64_t>(p.sizes().begin(), p.sizes().end()), p.data_ptr<float>()});
  }
  return LoadHfInto(dir, targets, impl_->layers);
}

std::vector<TensorView> ModelPart::FrozenViews() const {
  std::vector<TensorView> out;
  for (const auto& [name, p] : impl_->params) {
    if (p.requires_grad()) continue;
    TensorView v;
    v.name = name;
    v.shape.assign(p.sizes().begin(), p.sizes().end());
    v.data = reinterpret_cast<const char*>(p.data_ptr<float>());
    v.numel = p.numel();
    out.push_back(std::move(v));
  }
  return out;
}

void ModelPart::SetNoPeek(double alpha) { impl_->nopeek = alpha; }

StatusOr<double> DistanceCorrelation(const Activations& x, const Activations& z) {
  if (x.batch() != z.batch() || x.batch() < 2) {
    return absl::InvalidArgumentError("distance correlation needs two batches of >= 2 rows");
  }
  try {
    torch::NoGradGuard no_grad;
    return DistanceCorrelationTensor(ToTensor(x), ToTensor(z)).item<double>();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(e.what_without_backtrace());
  }
}

Status ModelPart::ResetOptimizer(const LocalTrainOptions& training) {
  ASSIGN_OR_RETURN(impl_->optimizer, Optimizers().Get(training.optimizer));
  impl_->training = training;
  for (auto& s : impl_->stages) s.recompute(training.recompute);
  impl_->pending.clear();
  torch::NoGradGuard no_grad;
  const bool adam = impl_->optimizer->second_moment;
  for (size_t i = 0; i < impl_->params.size(); ++i) {
    const torch::Tensor& p = impl_->params[i].second;
    const bool trains = p.requires_grad();
    impl_->first[i] = trains && (adam || training.momentum != 0) ? torch::zeros_like(p) : torch::Tensor();
    impl_->second[i] = trains && adam ? torch::zeros_like(p) : torch::Tensor();
  }
  std::fill(impl_->steps.begin(), impl_->steps.end(), 0);
  for (auto& [name, p] : impl_->params) {
    if (p.grad().defined()) p.mutable_grad().zero_();
  }
  return absl::OkStatus();
}

StatusOr<Activations> ModelPart::Forward(int64_t id, const Activations& in, int from) {
  RETURN_IF_ERROR(CheckActivations(in));
  ASSIGN_OR_RETURN(from, impl_->From(from));
  if (impl_->pending.count(id)) {
    return absl::AlreadyExistsError(absl::StrCat("micro-batch ", id, " is already pending"));
  }
  try {
    auto x = Impl::Input(in, from);
    auto y = impl_->Run(x, from);
    Activations out = FromTensor(y);
    impl_->pending[id] = {x, y, from, {}};
    return out;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("forward failed: ", e.what_without_backtrace()));
  }
}

StatusOr<Activations> ModelPart::Backward(int64_t id, const Activations& grad_out) {
  ASSIGN_OR_RETURN(Probe p, BackwardPass(id, grad_out, /*probe=*/false, /*step=*/true));
  return std::move(p.grad_in);
}

StatusOr<ModelPart::Probe> ModelPart::BackwardProbe(int64_t id, const Activations& grad_out, bool step) {
  if (impl_->accumulate > 0) return absl::FailedPreconditionError("a probe is not taken between micro-batch steps");
  return BackwardPass(id, grad_out, /*probe=*/true, step);
}

StatusOr<ModelPart::Probe> ModelPart::BackwardPass(int64_t id, const Activations& grad_out, bool probe, bool step) {
  RETURN_IF_ERROR(CheckActivations(grad_out));
  auto it = impl_->pending.find(id);
  if (it == impl_->pending.end()) {
    return absl::NotFoundError(absl::StrCat("no pending micro-batch ", id));
  }
  Impl::Pending p = std::move(it->second);
  impl_->pending.erase(it);
  std::vector<int64_t> shape(p.output.sizes().begin(), p.output.sizes().end());
  if (shape != grad_out.shape) {
    return absl::InvalidArgumentError("gradient shape differs from the output's");
  }
  try {
    // Back-propagate through the weights the forward pass used, then step the live ones.
    std::vector<torch::Tensor> live;
    if (!p.stash.empty()) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < impl_->params.size(); ++i) {
        if (!p.stash[i].defined()) {  // frozen: the same weights
          live.emplace_back();
          continue;
        }
        auto w = impl_->params[i].second.data();
        live.push_back(w.clone());
        w.copy_(p.stash[i]);
      }
    }
    if (!p.output.requires_grad()) {
      // Nothing before the output trains (every tensor frozen, the input not a
      // gradient's concern): no backward pass, and the step below changes nothing.
    } else if (impl_->nopeek > 0 && p.from == 0) {
      // grad_out back-propagated, plus the gradient of alpha · dCor(input, output); over
      // accumulated micro-batches, of the mean of theirs (as the loss is).
      const double alpha = impl_->accumulate > 0 ? impl_->nopeek / impl_->accumulate : impl_->nopeek;
      auto total = (p.output * ToTensor(grad_out)).sum() + alpha * DistanceCorrelationTensor(p.input.detach(), p.output);
      total.backward();
    } else {
      p.output.backward(ToTensor(grad_out));
    }
    Probe out;
    out.grad_in = Impl::InputGrad(p.input);
    if (impl_->accumulate > 0) return out;  // nothing stashed: no step yet
    if (probe) {
      for (auto& [name, t] : impl_->params) {
        if (!t.requires_grad()) continue;
        if (t.grad().defined()) {
          const torch::Tensor g = t.grad().detach().contiguous().to(torch::kFloat32);
          out.first_gradient.assign(g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
        }
        break;
      }
    }
    if (!live.empty()) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < impl_->params.size(); ++i) {
        if (live[i].defined()) impl_->params[i].second.data().copy_(live[i]);
      }
    }
    if (step) {
      impl_->Step(p.from);
    } else {
      impl_->ZeroGrads();
    }
    return out;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("backward failed: ", e.what_without_backtrace()));
  }
}

StatusOr<ModelPart::LossStep> ModelPart::TrainWithLoss(const Activations& in,
                                                       const std::vector<int64_t>& labels,
                                                       int from, double share) {
  RETURN_IF_ERROR(CheckActivations(in));
  ASSIGN_OR_RETURN(from, impl_->From(from));
  try {
    auto x = Impl::Input(in, from);
    auto logits = impl_->Run(x, from);
    if (logits.dim() == 3) logits = logits.reshape({-1, logits.size(2)});  // a label per token
    if (static_cast<int64_t>(labels.size()) != logits.size(0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          labels.size(), " labels for ", logits.size(0), " predictions (one per sample, or per "
          "token for a language model)"));
    }
    auto y = torch::from_blob(const_cast<int64_t*>(labels.data()),
                              {static_cast<int64_t>(labels.size())}, torch::kInt64);
    auto loss = torch::nn::functional::cross_entropy(
        logits, y,
        torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(
            impl_->training.label_smoothing));
    LossStep r;
    r.loss = loss.item<double>();
    // A diverged part (or activations it cannot take) stops here, before any gradient
    // reaches its weights or the caller.
    const auto diverged = [&] {
      return absl::FailedPreconditionError(
          absl::StrCat("the loss or its gradient is not finite (loss ", r.loss, "): no step taken"));
    };
    if (!std::isfinite(r.loss)) return diverged();
    if (impl_->accumulate > 0) {
      (share > 0 ? loss * share : loss / impl_->accumulate).backward();
    } else {
      loss.backward();
      if (x.requires_grad() && x.grad().defined() && !torch::isfinite(x.grad()).all().item<bool>()) {
        impl_->ZeroGrads();
        return diverged();
      }
      impl_->Step(from);
    }
    r.correct = logits.argmax(1).eq(y).sum().item<int64_t>();
    r.grad_in = Impl::InputGrad(x);
    return r;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("training step failed: ", e.what_without_backtrace()));
  }
}

StatusOr<std::vector<int>> ParameterStages(const ModelSpec& spec) {
  ASSIGN_OR_RETURN(std::vector<TorchStage> stages, BuildTorchStages(spec));
  std::vector<int> out;
  std::set<std::string> names;
  for (size_t i = 0; i < stages.size(); ++i) {
    for (const auto& p : stages[i].parameters()) {
      if (names.insert(p.first).second) out.push_back(static_cast<int>(i));
    }
  }
  return out;
}

StatusOr<std::vector<StageProfile>> ProfileStages(const ModelSpec& spec,
                                                  const std::vector<int64_t>& sample_shape,
                                                  int batch, int reps, bool recompute) {
  ASSIGN_OR_RETURN(std::vector<TorchStage> stages, BuildTorchStages(spec));
  std::vector<StageProfile> out;
  // Each stage's forward pass keeps (for its backward) what this thread's tensors grow by.
  auto tensors = std::make_shared<ThreadTensorBytes>();
  const c10::DebugInfoGuard count(c10::DebugInfoKind::PROFILER_STATE, tensors);
  try {
    std::vector<int64_t> shape = {batch};
    shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
    // A language model reads token ids (as floats, the way split learning carries them).
    torch::Tensor x = spec.text()
                          ? torch::randint(0, spec.gpt.vocab, shape).to(torch::kFloat32)
                          : torch::randn(shape);
    for (auto& s : stages) {
      StageProfile p;
      s.recompute(recompute);
      for (auto& [name, w] : s.quantized()) p.quantized_bytes += static_cast<int64_t>(w->bytes.size());
      for (auto& [name, t] : s.parameters()) {
        p.param_elements += t.numel();
        if (t.requires_grad()) p.trainable_elements += t.numel();
      }
      std::vector<double> times;
      torch::Tensor y;
      for (int r = 0; r <= reps; ++r) {  // r = 0 warms up
        auto xi = x.detach().requires_grad_(true);
        y.reset();  // the last pass's output is freed before, not during, the measurement
        const int64_t before = tensors->held();
        const auto t0 = std::chrono::steady_clock::now();
        y = s.forward(xi);
        const int64_t after = tensors->held();
        if (r > 0) {  // the least of the timed passes: the warm-up's one-time allocations aside
          const int64_t saved = after > before ? (after - before) / batch : 0;
          p.saved_bytes = r == 1 ? saved : std::min(p.saved_bytes, saved);
        }
        if (y.requires_grad()) y.backward(torch::ones_like(y));  // else a frozen stage
        const double dt =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) times.push_back(dt);
      }
      std::sort(times.begin(), times.end());
      p.seconds = times[times.size() / 2];
      p.out_elements = y.numel() / batch;
      p.out_shape.assign(y.sizes().begin() + 1, y.sizes().end());
      for (auto& [name, t] : s.parameters()) {
        if (t.grad().defined()) t.mutable_grad().zero_();
      }
      x = y.detach();
      out.push_back(p);
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot profile ", spec.name, ": ",
                                                   e.what_without_backtrace()));
  }
  return out;
}

}  // namespace cleave
