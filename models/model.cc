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

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/builtin_models.h"
#include "models/fast_trainer.h"
#include "models/gpt.h"
#include "models/llama.h"
#include "models/losses.h"
#include "models/optimizer_step.h"
#include "models/optimizers.h"
#include "models/torch_stages.h"

namespace cleave {
namespace {

namespace nn = torch::nn;

// A data set's examples as held for training and evaluation: as stored (pixels as
// uint8, a quarter of their floats; features as float32), normalised a batch at a time
// by Normalise; text as its token ids (int64 [n, length]).
torch::Tensor ExamplesToTensor(const Dataset& d) {
  std::vector<int64_t> sizes = {d.size};
  sizes.insert(sizes.end(), d.shape.begin(), d.shape.end());
  void* bytes = const_cast<uint8_t*>(d.bytes.data());
  switch (d.type) {
    case ExampleType::kToken: return torch::from_blob(bytes, sizes, torch::kInt32).to(torch::kInt64);
    case ExampleType::kUint8: return torch::from_blob(bytes, sizes, torch::kUInt8).clone();
    case ExampleType::kFloat32: break;
  }
  return torch::from_blob(bytes, sizes, torch::kFloat32).clone();
}

// Examples held by ExamplesToTensor as the model's input: (x - mean[c]) / stddev[c],
// x the value (pixels / 255) and c the channel or feature; text ids as they are.
torch::Tensor Normalise(const torch::Tensor& held, const std::vector<float>& mean,
                        const std::vector<float>& stddev) {
  if (held.scalar_type() == torch::kInt64) return held;
  torch::Tensor x = held.scalar_type() == torch::kUInt8 ? held.to(torch::kFloat32).div_(255.0f)
                    : mean.empty()                      ? held
                                                        : held.clone();
  if (mean.empty()) return x;
  if (mean.size() == 1) return x.sub_(mean[0]).div_(stddev[0]);
  std::vector<int64_t> per_channel(held.dim(), 1);
  per_channel[1] = static_cast<int64_t>(mean.size());  // shape[0]
  return x.sub_(torch::tensor(mean).view(per_channel)).div_(torch::tensor(stddev).view(per_channel));
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
  // A language model's context and vocabulary (ModelSpec::text()); 0 for other models.
  int64_t context = 0, vocab = 0;

  // Cached tensors of the last dataset seen (clients train on one dataset all run long),
  // keyed by its contents: a dataset at the address of an earlier one (a temporary
  // subset, say) is not mistaken for it.
  size_t cached_key = 0;
  bool cached = false;
  // Examples as held (ExamplesToTensor), labels, regression targets (undefined if
  // none). Text: x holds each sequence but its last token, y (int64 [n, length - 1])
  // each next token. mean and stddev normalise a batch of x (Input).
  torch::Tensor x, y, t;
  std::vector<float> mean, stddev;

  torch::Tensor Input(const torch::Tensor& held) const { return Normalise(held, mean, stddev); }

  // Parameters, then floating-point buffers (AppendFloatBuffers).
  // Parameters() order; without the frozen tensors (FrozenTensors()) unless `frozen`.
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters(bool frozen = true) const {
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
        if (frozen || p.value().requires_grad()) out.emplace_back(p.key(), p.value());
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
    mean = d.mean;
    stddev = d.stddev;
    if (d.type == ExampleType::kToken) {  // ids stored as -1 - id are read, not predicted
      const int64_t length = x.size(1);
      const auto read_only = x.lt(0);
      x = torch::where(read_only, -1 - x, x);
      y = x.slice(1, 1, length).masked_fill(read_only.slice(1, 1, length), kNoTarget).contiguous();
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
      if (spec.width != 1) return absl::InvalidArgumentError("a TorchScript model has no width-scaled submodels");
      std::istringstream in(spec.torchscript);
      impl->script = std::make_unique<torch::jit::Module>(torch::jit::load(in));
    } else {
      ASSIGN_OR_RETURN(impl->seq, BuildBuiltin(spec));
      impl->fast = FastTrainer::Compile(impl->seq);
      if (spec.text()) {
        impl->context = spec.gpt.context;
        impl->vocab = spec.gpt.vocab;
      }
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load model ", spec.name, ": ", e.what_without_backtrace()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("model ", spec.name, ": out of memory while building it"));
  }
  if (impl->NamedParameters().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, " has no parameters"));
  }
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

namespace {

ParameterSet Copy(const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  ParameterSet ps;
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : named) {
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

Status CopyIn(const ParameterSet& params, const std::vector<std::pair<std::string, torch::Tensor>>& named) {
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

}  // namespace

ParameterSet Model::Parameters() const { return Copy(impl_->NamedParameters()); }

Status Model::SetParameters(const ParameterSet& params) {
  return CopyIn(params, impl_->NamedParameters());
}

ParameterSet Model::TrainedParameters() const {
  return Copy(impl_->NamedParameters(/*frozen=*/false));
}

Status Model::SetTrainedParameters(const ParameterSet& params) {
  return CopyIn(params, impl_->NamedParameters(/*frozen=*/false));
}

Status Model::LoadBase(const ParameterSet& base) {
  const std::vector<std::string> frozen = FrozenTensors();
  if (base.size() != frozen.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the base holds ", base.size(), " tensors; the model has ",
                                                   frozen.size(), " frozen ones"));
  }
  if (frozen.empty()) return absl::OkStatus();
  std::vector<std::pair<torch::Tensor, const Tensor*>> pairs;
  for (const auto& p : impl_->seq->named_parameters(/*recurse=*/true)) {
    if (p.value().requires_grad()) continue;
    const Tensor* src = base.Find(p.key());
    const std::vector<int64_t> shape(p.value().sizes().begin(), p.value().sizes().end());
    if (src == nullptr || src->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat("frozen tensor ", p.key(),
                                                     src == nullptr ? " is not in the base" : " has another shape in the base"));
    }
    pairs.emplace_back(p.value(), src);
  }
  torch::NoGradGuard no_grad;
  for (auto& [p, src] : pairs) {
    // The base's memory: the model's own copy is freed.
    p.set_data(torch::from_blob(const_cast<float*>(src->values.data()), p.sizes(), torch::kFloat32));
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

// The registered loss `loss` when it suits `data`: a regression loss needs regression
// targets, the others labels (a kAny loss takes either).
StatusOr<const LossKind*> LossFor(const std::string& loss, const Dataset& data) {
  ASSIGN_OR_RETURN(const LossKind* kind, Losses().Get(loss));
  if (kind->task != LossTask::kAny &&
      (kind->task == LossTask::kRegression) != !data.targets.empty()) {
    return absl::InvalidArgumentError("loss " + loss + " does not suit this data's labels");
  }
  return kind;
}

// One optimizer step on `params` with their accumulated gradients (which it zeroes), as
// train.optimizer defines it (models/optimizers.h), after the FedProx
// term and gradient clipping (torch.nn.utils.clip_grad_norm_). Fused per parameter.
class LocalOptimizer {
 public:
  LocalOptimizer(std::vector<torch::Tensor> params, const LocalTrainOptions& o,
                 const OptimizerKind& kind)
      : params_(std::move(params)), o_(o), kind_(kind) {
    for (auto& p : params_) {
      if (o.proximal_mu > 0) anchor_.push_back(p.detach().clone());
      first_.push_back(torch::zeros_like(p));
      second_.push_back(kind_.second_moment ? torch::zeros_like(p) : torch::Tensor());
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
      kind_.step(o_, steps_, params_[i], grads[i], first_[i], second_[i]);
      grads[i].zero_();  // ready for the next backward, instead of a separate zero_grad pass
    }
  }

 private:
  std::vector<torch::Tensor> params_, anchor_, first_, second_;
  const LocalTrainOptions& o_;
  const OptimizerKind& kind_;
  int64_t steps_ = 0;
};

}  // namespace

std::vector<int64_t> FirstBatchIndices(int64_t n, uint64_t seed, int64_t batch) {
  if (n < 1) return {};
  auto gen = at::detail::createCPUGenerator(seed);  // as Train's first epoch
  const torch::Tensor perm = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kInt64));
  return std::vector<int64_t>(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + std::min(n, batch));
}

StatusOr<TrainStats> Model::Train(const Dataset& data, const LocalTrainOptions& o) {
  if (data.size == 0) return absl::FailedPreconditionError("no training data");
  ASSIGN_OR_RETURN(const OptimizerKind* optimizer_kind, Optimizers().Get(o.optimizer));
  ASSIGN_OR_RETURN(const LossKind* loss_kind, LossFor(o.loss, data));
  const auto start = std::chrono::steady_clock::now();
  TrainStats stats;
  try {
    impl_->PrepareData(data);
    std::vector<torch::Tensor> params;  // the trainable tensors (buffers have no gradient)
    for (auto& [name, t] : impl_->NamedParameters()) {
      if (t.requires_grad()) params.push_back(t);
    }
    LocalOptimizer optimizer(params, o, *optimizer_kind);
    // FastTrainer's loss is plain cross-entropy.
    const bool fast = impl_->fast && o.loss == "cross_entropy" && o.label_smoothing == 0;
    impl_->SetTraining(true);
    if (impl_->seq) SetRecompute(*impl_->seq, o.recompute);
    auto gen = at::detail::createCPUGenerator(o.seed);
    const int64_t n = data.size;
    const int64_t total_steps = TaskSteps(o.local_steps, o.local_epochs, n, o.batch_size);
    int64_t steps = 0;
    double loss_sum = 0;
    int64_t loss_count = 0;
    while (steps < total_steps) {
      // Shuffle once per epoch (the examples as held: pixels stay bytes); batches are
      // then contiguous views, not gathers.
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
        auto xb = impl_->Input(xs.slice(0, b, e));
        if (data.augment.enabled()) xb = Augment(xb, data.augment, gen);
        auto yb = ys.slice(0, b, e);
        double loss;
        if (fast) {
          loss = impl_->fast->ForwardBackward(xb, yb);
        } else {
          const auto out = impl_->Forward(xb);
          const auto tb = ts.defined() ? ts.slice(0, b, e) : ts;
          auto l = loss_kind->compute({out, yb, tb, o.label_smoothing, impl_->loss_script.get()});
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

namespace {

// What Model::Evaluate counts over the batches of a dataset, by task: tokens (text),
// absolute and squared errors (regression), the confusion counts (binary), top-1 and
// top-5 hits and per-class counts (classes).
struct EvalTally {
  double loss_sum = 0, abs_sum = 0, sq_sum = 0;
  int64_t correct = 0, top5 = 0, tp = 0, fp = 0, fn = 0, tokens = 0;
  bool binary = false;
  std::vector<int64_t> class_correct, class_total;

  void AddText(const torch::Tensor& out, const torch::Tensor& y) {
    TORCH_CHECK(out.dim() == 3, "text needs outputs of shape [N, T, vocab], not ", out.sizes());
    correct += out.argmax(2).eq(y).sum().item<int64_t>();  // kNoTarget never equals
    tokens += y.ne(kNoTarget).sum().item<int64_t>();
  }
  void AddRegression(const torch::Tensor& out, const torch::Tensor& t) {
    TORCH_CHECK(out.numel() == t.numel(), "regression needs one output per example, not ",
                out.sizes());
    auto err = out.reshape({-1}) - t;
    abs_sum += err.abs().sum().item<double>();
    sq_sum += (err * err).sum().item<double>();
  }
  void AddBinary(const torch::Tensor& out, const torch::Tensor& y) {
    binary = true;
    auto pred = out.reshape({-1}).gt(0).to(torch::kInt64);
    correct += pred.eq(y).sum().item<int64_t>();
    tp += (pred * y).sum().item<int64_t>();
    fp += (pred * (1 - y)).sum().item<int64_t>();
    fn += ((1 - pred) * y).sum().item<int64_t>();
  }
  void AddClasses(const torch::Tensor& out, const torch::Tensor& y) {
    TORCH_CHECK(out.dim() == 2, "classification needs outputs of shape [N, classes], not ",
                out.sizes());
    auto hit = out.argmax(1).eq(y);
    correct += hit.sum().item<int64_t>();
    const int64_t classes = out.size(1);
    if (classes >= 5) {
      top5 += std::get<1>(out.topk(5, 1)).eq(y.unsqueeze(1)).any(1).sum().item<int64_t>();
    }
    class_total.resize(classes);
    class_correct.resize(classes);
    auto totals = torch::bincount(y, {}, classes);
    auto hits = torch::bincount(y.masked_select(hit), {}, classes);
    for (int64_t c = 0; c < classes; ++c) {
      class_total[c] += totals[c].item<int64_t>();
      class_correct[c] += hits[c].item<int64_t>();
    }
  }

  // Text: the loss and accuracy per token, perplexity, bits per byte of text.
  void FinishText(double bytes_per_token, EvalStats* s) const {
    s->loss = loss_sum / static_cast<double>(tokens);
    s->accuracy = static_cast<double>(correct) / static_cast<double>(tokens);
    s->metrics["perplexity"] = std::exp(s->loss);
    s->metrics["bits_per_byte"] = s->loss / std::log(2.0) / (bytes_per_token > 0 ? bytes_per_token : 1);
    s->metrics["tokens"] = static_cast<double>(tokens);
  }
  void Finish(int64_t examples, bool regression, EvalStats* s) const {
    const double n = static_cast<double>(examples);
    s->loss = loss_sum / n;
    if (regression) {
      s->metrics["mae"] = abs_sum / n;
      s->metrics["rmse"] = std::sqrt(sq_sum / n);
      return;
    }
    s->accuracy = correct / n;
    if (binary) {
      const double precision = tp + fp > 0 ? double(tp) / (tp + fp) : 0;
      const double recall = tp + fn > 0 ? double(tp) / (tp + fn) : 0;
      s->metrics["precision"] = precision;
      s->metrics["recall"] = recall;
      s->metrics["f1"] = precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0;
      return;
    }
    if (class_total.size() >= 5) s->metrics["top5_accuracy"] = top5 / n;
    for (size_t c = 0; c < class_total.size(); ++c) {
      s->per_class_accuracy.push_back(
          class_total[c] > 0 ? double(class_correct[c]) / class_total[c] : std::nan(""));
    }
  }
};

}  // namespace

StatusOr<EvalStats> Model::Evaluate(const Dataset& data, int batch_size,
                                    const std::string& loss) const {
  if (data.size == 0) return absl::FailedPreconditionError("no evaluation data");
  ASSIGN_OR_RETURN(const LossKind* kind, LossFor(loss, data));
  const bool regression = !data.targets.empty();
  const bool text = data.type == ExampleType::kToken;
  EvalStats s;
  s.examples = data.size;
  EvalTally tally;
  try {
    torch::NoGradGuard no_grad;
    impl_->PrepareData(data);
    impl_->SetTraining(false);
    for (int64_t b = 0; b < data.size; b += batch_size) {
      const int64_t e = std::min(data.size, b + batch_size);
      auto out = impl_->Forward(impl_->Input(impl_->x.slice(0, b, e)));
      auto yb = impl_->y.slice(0, b, e);
      auto tb = regression ? impl_->t.slice(0, b, e) : torch::Tensor();
      tally.loss_sum += kind->compute({out, yb, tb, 0, impl_->loss_script.get(), /*sum=*/true})
                            .item<double>();
      // A kAny (TorchScript) loss's task follows from the data and the model's outputs.
      const bool binary = !regression && (kind->task == LossTask::kBinary ||
                                          (kind->task == LossTask::kAny && out.dim() <= 2 &&
                                           out.numel() == out.size(0)));
      if (text) {  // next-token prediction: every position counts
        tally.AddText(out, yb);
      } else if (regression) {
        tally.AddRegression(out, tb);
      } else if (binary) {
        tally.AddBinary(out, yb);
      } else {
        tally.AddClasses(out, yb);
      }
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("evaluation failed: ", e.what_without_backtrace()));
  }
  if (text) {
    tally.FinishText(data.bytes_per_token, &s);
  } else {
    tally.Finish(data.size, regression, &s);
  }
  return s;
}

StatusOr<std::vector<float>> Model::Outputs(const Dataset& data, int batch_size) {
  if (data.size == 0) return absl::FailedPreconditionError("no data");
  if (data.type == ExampleType::kToken) return absl::FailedPreconditionError("outputs are for classification models");
  std::vector<float> out;
  try {
    torch::NoGradGuard no_grad;
    impl_->PrepareData(data);
    impl_->SetTraining(false);
    for (int64_t b = 0; b < data.size; b += batch_size) {
      const int64_t e = std::min(data.size, b + batch_size);
      const torch::Tensor o = impl_->Forward(impl_->Input(impl_->x.slice(0, b, e))).contiguous();
      if (o.dim() != 2) return absl::FailedPreconditionError("outputs are for classification models");
      out.insert(out.end(), o.data_ptr<float>(), o.data_ptr<float>() + o.numel());
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("outputs failed: ", e.what_without_backtrace()));
  }
  return out;
}

StatusOr<double> Model::Distill(const Dataset& data, const std::vector<float>& teacher_logits,
                                const DistillOptions& o) {
  if (data.size == 0 || teacher_logits.empty() || teacher_logits.size() % data.size != 0) {
    return absl::InvalidArgumentError("distillation: the teachers' outputs do not match the data");
  }
  const int64_t classes = static_cast<int64_t>(teacher_logits.size()) / data.size;
  const double t = o.temperature;
  std::vector<double> last;
  try {
    impl_->PrepareData(data);
    std::vector<torch::Tensor> params;
    for (auto& [name, p] : impl_->NamedParameters()) {
      if (p.requires_grad()) params.push_back(p);
    }
    torch::optim::Adam adam(params, torch::optim::AdamOptions(o.lr));
    const torch::Tensor teacher =
        torch::from_blob(const_cast<float*>(teacher_logits.data()), {data.size, classes}, torch::kFloat32);
    auto gen = at::detail::createCPUGenerator(o.seed);
    impl_->SetTraining(true);
    for (int64_t step = 0; step < o.steps; ++step) {
      const auto idx = torch::randint(data.size, {std::min<int64_t>(o.batch_size, data.size)}, gen,
                                      torch::TensorOptions().dtype(torch::kInt64));
      const torch::Tensor out = impl_->Forward(impl_->Input(impl_->x.index_select(0, idx)));
      if (out.dim() != 2 || out.size(1) != classes) {
        return absl::InvalidArgumentError("distillation: the model's outputs are not the teachers' classes");
      }
      const torch::Tensor target = torch::softmax(teacher.index_select(0, idx) / t, 1);
      const torch::Tensor loss =
          torch::kl_div(torch::log_softmax(out / t, 1), target, at::Reduction::Sum) / out.size(0) * (t * t);
      adam.zero_grad();
      loss.backward();
      adam.step();
      last.push_back(loss.item<double>());
      if (last.size() > 10) last.erase(last.begin());
    }
    impl_->SetTraining(false);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("distillation failed: ", e.what_without_backtrace()));
  }
  double sum = 0;
  for (double l : last) sum += l;
  return last.empty() ? 0.0 : sum / static_cast<double>(last.size());
}

namespace {

// The context and vocabulary of a language model's embedding stage; FAILED_PRECONDITION
// for other models.
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
  if (impl_->vocab == 0) return absl::FailedPreconditionError("only a language model (gpt, hf) reads token ids");
  RETURN_IF_ERROR(CheckIds(ids, impl_->vocab, "input"));
  if (static_cast<int64_t>(ids.size()) > impl_->context) {
    return absl::InvalidArgumentError(absl::StrCat(ids.size(), " tokens exceed the context of ",
                                                   impl_->context));
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
                                               double temperature, int top_k, uint64_t seed,
                                               double top_p, int32_t eos) {
  if (impl_->vocab == 0) return absl::FailedPreconditionError("only a language model (gpt, hf) reads token ids");
  const int64_t context = impl_->context, vocab = impl_->vocab;
  RETURN_IF_ERROR(CheckIds(prompt, vocab, "prompt"));
  std::vector<int32_t> out;
  try {
    torch::NoGradGuard no_grad;
    impl_->SetTraining(false);
    auto gen = at::detail::createCPUGenerator(seed);
    std::vector<int64_t> ids(prompt.begin(), prompt.end());
    // A Llama-family decoder keeps its keys and values (models/llama.h): each step runs
    // the new token only. The cache holds ids[window, seen); past the context it starts
    // again from the last `context` ids, as the uncached window does.
    const bool cached = !impl_->seq.is_empty() && SetKvCache(impl_->seq, true);
    struct CacheOff {
      nn::Sequential& seq;
      bool on;
      ~CacheOff() {
        if (on) SetKvCache(seq, false);
      }
    } off{impl_->seq, cached};
    int64_t window = 0, seen = 0;
    for (int i = 0; i < tokens; ++i) {
      const int64_t n = static_cast<int64_t>(ids.size());
      int64_t start = std::max<int64_t>(0, n - context);
      if (cached) {
        if (seen == 0 || n - window > context) {
          SetKvCache(impl_->seq, true);
          window = start;
        } else {
          start = seen;
        }
        seen = n;
      }
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
        if (top_p < 1) {
          // Drop the least likely tokens whose probabilities add up to at most 1 - top_p,
          // keeping the most likely one.
          auto [sorted, order] = logits.sort(/*dim=*/0, /*descending=*/false);
          auto drop = torch::softmax(sorted, 0).cumsum(0) <= (1 - top_p);
          drop[-1] = false;
          logits = logits.index_fill(0, order.masked_select(drop), -std::numeric_limits<float>::infinity());
        }
        next = torch::multinomial(torch::softmax(logits, 0), 1, false, gen).item<int64_t>();
      }
      ids.push_back(next);
      out.push_back(static_cast<int32_t>(next));
      if (eos >= 0 && next == eos) break;
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

QuantizedSet Model::QuantizedBase() const {
  if (impl_->script) return {};
  return QuantizedSetOf(QuantizedWeights(*impl_->seq));
}

Status Model::LoadQuantized(const QuantizedSet& set) {
  if (impl_->script) return absl::InvalidArgumentError("a TorchScript model has no quantized base");
  return LoadQuantizedWeights(QuantizedWeights(*impl_->seq), set);
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
std::atomic<int> g_torch_threads{0};  // SetTorchThreads' value; 0 = not set
}  // namespace

// SetTorchBufferCache(kTorchBufferCacheBytes) unless it was called (models/buffer_cache.cc).
void SetDefaultTorchBufferCache();

void UseTorchThreads() {
  const int n = g_torch_threads.load();
  if (n > 0) at::set_num_threads(n);  // in an OpenMP build: this thread's team size
}

void SetTorchThreads(int threads) {
  SetDefaultTorchBufferCache();
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
