#include "models/inversion.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "models/torch_stages.h"

namespace cleave {
namespace {

torch::Tensor ToTorch(const Activations& a) {
  return torch::from_blob(const_cast<float*>(a.values.data()), a.shape, torch::kFloat32).clone();
}

Activations FromTorch(const torch::Tensor& t) {
  torch::Tensor c = t.detach().contiguous().to(torch::kFloat32);
  Activations a;
  a.shape.assign(c.sizes().begin(), c.sizes().end());
  a.values.assign(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  return a;
}

// The client part [0, cut) with the recorded values, frozen, in evaluation mode.
struct FrozenPart {
  std::vector<TorchStage> stages;

  static StatusOr<FrozenPart> Build(const ClientPartView& v, bool text = false) {
    if (v.spec.text() != text) {
      return absl::InvalidArgumentError(text ? "token inversion is for decoders (model gpt or hf)"
                                             : "input reconstruction is for image and table models; "
                                               "a decoder's tokens: cleave attack tokens");
    }
    if (v.cut < 1) return absl::InvalidArgumentError("the record does not say where the model was cut");
    FrozenPart p;
    ASSIGN_OR_RETURN(p.stages, BuildTorchStages(v.spec, 0, v.cut));
    if (static_cast<int>(p.stages.size()) < v.cut) {
      return absl::InvalidArgumentError(absl::StrCat("model ", v.spec.name, " has ", p.stages.size(),
                                                     " stages, the record's cut is ", v.cut));
    }
    p.stages.resize(v.cut);
    torch::NoGradGuard no_grad;
    for (TorchStage& s : p.stages) {
      s.train(false);
      for (auto& [name, t] : s.parameters()) {
        const Tensor* src = v.part.Find(name);
        if (src == nullptr) return absl::InvalidArgumentError(absl::StrCat("the recorded part has no ", name));
        if (static_cast<int64_t>(src->values.size()) != t.numel()) {
          return absl::InvalidArgumentError(absl::StrCat("the recorded part's ", name, " has another shape"));
        }
        t.copy_(torch::from_blob(const_cast<float*>(src->values.data()), t.sizes(), torch::kFloat32));
        t.set_requires_grad(false);
      }
    }
    return p;
  }

  torch::Tensor Forward(torch::Tensor x) const {
    for (const TorchStage& s : stages) x = s.forward(x);
    return x;
  }
};

// What the device adds before sending: noise, then the codec's loss.
StatusOr<torch::Tensor> AsSent(const ClientPartView& v, torch::Tensor act, std::mt19937_64& rng) {
  if (v.noise > 0) {
    torch::Tensor noise = torch::empty_like(act);
    std::normal_distribution<float> n(0, static_cast<float>(v.noise));
    float* p = noise.data_ptr<float>();
    for (int64_t i = 0; i < noise.numel(); ++i) p[i] = n(rng);
    act = act + noise;
  }
  if (v.codec.empty() || v.codec == "none") return act;
  ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, MakeStatelessCodec(v.codec, 1));
  Activations a = FromTorch(act);
  ASSIGN_OR_RETURN(a.values, DecodeValues(codec.get(), EncodeValues(codec.get(), a.values, a.shape), a.shape));
  return ToTorch(a);
}

Status Catch(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("LibTorch: ", e.what()));
  }
  return absl::OkStatus();
}

// The mean absolute difference of neighbouring pixels of images [B, C, H, W], down and
// across: the prior that keeps optimised images smooth.
torch::Tensor TotalVariation(const torch::Tensor& x) {
  using torch::indexing::Slice;
  const torch::Tensor dh = x.index({Slice(), Slice(), Slice(1), Slice()}) - x.index({Slice(), Slice(), Slice(0, -1), Slice()});
  const torch::Tensor dw = x.index({Slice(), Slice(), Slice(), Slice(1)}) - x.index({Slice(), Slice(), Slice(), Slice(0, -1)});
  return dh.abs().mean() + dw.abs().mean();
}

// Two hidden layers of `hidden` with ReLU: the learned inverters' network.
torch::nn::Sequential Mlp(int64_t in, int64_t hidden, int64_t out) {
  return torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, hidden),
                               torch::nn::ReLU(), torch::nn::Linear(hidden, out));
}

// Trains `net` with Adam for o.steps steps, each on o.batch auxiliary inputs drawn at
// random: `loss(net, activations as the device sends them, the inputs)`.
Status TrainOnAux(const ClientPartView& view, const FrozenPart& part, const torch::Tensor& inputs,
                  const InversionOptions& o, torch::nn::Sequential& net,
                  const std::function<torch::Tensor(const torch::Tensor& act, const torch::Tensor& x)>& loss) {
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(o.lr));
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int64_t> pick(0, inputs.size(0) - 1);
  for (int step = 0; step < o.steps; ++step) {
    std::vector<int64_t> idx(std::min<int64_t>(o.batch, inputs.size(0)));
    for (int64_t& i : idx) i = pick(rng);
    const torch::Tensor x = inputs.index_select(0, torch::tensor(idx, torch::kInt64));
    torch::Tensor act;
    RETURN_IF_ERROR(Catch([&] {
      torch::NoGradGuard no_grad;
      act = part.Forward(x);
    }));
    ASSIGN_OR_RETURN(act, AsSent(view, act, rng));
    RETURN_IF_ERROR(Catch([&] {
      adam.zero_grad();
      loss(act, x).backward();
      adam.step();
    }));
  }
  return absl::OkStatus();
}

}  // namespace

void SetInputRange(const Dataset& space, InversionOptions* o) {
  for (size_t ch = 0; ch < space.mean.size() && ch < space.stddev.size(); ++ch) {
    const float lo = -space.mean[ch] / space.stddev[ch], hi = (1 - space.mean[ch]) / space.stddev[ch];
    o->lo = ch == 0 ? lo : std::min(o->lo, lo);
    o->hi = ch == 0 ? hi : std::max(o->hi, hi);
  }
}

StatusOr<Activations> ClientActivations(const ClientPartView& view, const Activations& inputs, uint64_t seed) {
  ASSIGN_OR_RETURN(FrozenPart part, FrozenPart::Build(view, view.spec.text()));
  std::mt19937_64 rng(seed);
  torch::Tensor out;
  {
    torch::NoGradGuard no_grad;
    Status s = Catch([&] { out = part.Forward(ToTorch(inputs)); });
    RETURN_IF_ERROR(s);
  }
  ASSIGN_OR_RETURN(out, AsSent(view, out, rng));
  return FromTorch(out);
}

struct LearnedInverter::Impl {
  torch::nn::Sequential decoder{nullptr};
  std::vector<int64_t> input_shape;  // one example's
  int64_t act_elements = 0;          // per example
  float lo = 0, hi = 0;
};

LearnedInverter::LearnedInverter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LearnedInverter::~LearnedInverter() = default;

StatusOr<std::unique_ptr<LearnedInverter>> LearnedInverter::Train(const ClientPartView& view, const Activations& aux,
                                                                  const InversionOptions& o) {
  if (aux.batch() < 2) return absl::InvalidArgumentError("the learned inversion needs auxiliary inputs");
  ASSIGN_OR_RETURN(FrozenPart part, FrozenPart::Build(view));
  auto impl = std::make_unique<Impl>();
  impl->input_shape.assign(aux.shape.begin() + 1, aux.shape.end());
  impl->lo = o.lo, impl->hi = o.hi;
  torch::manual_seed(o.seed);
  const torch::Tensor inputs = ToTorch(aux);
  const int64_t in_elements = inputs[0].numel();
  Status s = Catch([&] {
    torch::NoGradGuard no_grad;
    impl->act_elements = part.Forward(inputs.slice(0, 0, 1))[0].numel();
  });
  RETURN_IF_ERROR(s);
  impl->decoder = Mlp(impl->act_elements, o.hidden, in_elements);
  RETURN_IF_ERROR(TrainOnAux(view, part, inputs, o, impl->decoder, [&](const torch::Tensor& act, const torch::Tensor& x) {
    return torch::mse_loss(impl->decoder->forward(act.reshape({act.size(0), -1})), x.reshape({x.size(0), -1}));
  }));
  return std::unique_ptr<LearnedInverter>(new LearnedInverter(std::move(impl)));
}

StatusOr<Activations> LearnedInverter::Invert(const Activations& activations) const {
  int64_t per = 1;
  for (size_t d = 1; d < activations.shape.size(); ++d) per *= activations.shape[d];
  if (activations.batch() < 1 || per != impl_->act_elements) {
    return absl::InvalidArgumentError(absl::StrCat("activations of ", per, " values per example; the inverter was "
                                                   "trained on ", impl_->act_elements));
  }
  torch::Tensor out;
  Status s = Catch([&] {
    torch::NoGradGuard no_grad;
    std::vector<int64_t> shape = {activations.batch()};
    shape.insert(shape.end(), impl_->input_shape.begin(), impl_->input_shape.end());
    out = impl_->decoder->forward(ToTorch(activations).reshape({activations.batch(), -1}))
              .reshape(shape)
              .clamp(impl_->lo, impl_->hi);
  });
  RETURN_IF_ERROR(s);
  return FromTorch(out);
}

struct LearnedTokenInverter::Impl {
  torch::nn::Sequential classifier{nullptr};
  int64_t dim = 0;
};

LearnedTokenInverter::LearnedTokenInverter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LearnedTokenInverter::~LearnedTokenInverter() = default;

StatusOr<std::unique_ptr<LearnedTokenInverter>> LearnedTokenInverter::Train(const ClientPartView& view,
                                                                            const Activations& aux,
                                                                            const InversionOptions& o) {
  if (aux.batch() < 2 || aux.shape.size() != 2) {
    return absl::InvalidArgumentError("the learned token inversion needs auxiliary sequences [N, T]");
  }
  ASSIGN_OR_RETURN(FrozenPart part, FrozenPart::Build(view, /*text=*/true));
  auto impl = std::make_unique<Impl>();
  torch::manual_seed(o.seed);
  const torch::Tensor inputs = ToTorch(aux);
  Status s = Catch([&] {
    torch::NoGradGuard no_grad;
    impl->dim = part.Forward(inputs.slice(0, 0, 1)).size(-1);
  });
  RETURN_IF_ERROR(s);
  impl->classifier = Mlp(impl->dim, o.hidden, view.spec.gpt.vocab);
  RETURN_IF_ERROR(TrainOnAux(view, part, inputs, o, impl->classifier, [&](const torch::Tensor& act, const torch::Tensor& x) {
    return torch::cross_entropy_loss(impl->classifier->forward(act.reshape({-1, impl->dim})),
                                     x.reshape({-1}).to(torch::kInt64));
  }));
  return std::unique_ptr<LearnedTokenInverter>(new LearnedTokenInverter(std::move(impl)));
}

StatusOr<std::vector<int64_t>> LearnedTokenInverter::Invert(const Activations& activations) const {
  if (activations.shape.size() != 3 || activations.shape[2] != impl_->dim) {
    return absl::InvalidArgumentError(absl::StrCat("activations of ", activations.shape.size(), " dimensions; the "
                                                   "inverter reads [B, T, ", impl_->dim, "]"));
  }
  torch::Tensor ids;
  Status s = Catch([&] {
    torch::NoGradGuard no_grad;
    ids = impl_->classifier->forward(ToTorch(activations).reshape({-1, impl_->dim})).argmax(1).contiguous();
  });
  RETURN_IF_ERROR(s);
  return std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
}

StatusOr<Activations> InvertByOptimisation(const ClientPartView& view, const Activations& activations,
                                           const InversionOptions& o) {
  ASSIGN_OR_RETURN(FrozenPart part, FrozenPart::Build(view));
  if (o.lo > o.hi) return absl::InvalidArgumentError("an empty input range");
  std::vector<int64_t> shape = {activations.batch()};
  shape.insert(shape.end(), view.spec.input_shape.begin(), view.spec.input_shape.end());
  torch::Tensor x;
  Status s = Catch([&] {
    const torch::Tensor target = ToTorch(activations);
    const float mid = o.lo > -1e29f && o.hi < 1e29f ? (o.lo + o.hi) / 2 : 0.0f;
    x = torch::full(shape, mid, torch::kFloat32).requires_grad_(true);
    torch::optim::Adam adam({x}, torch::optim::AdamOptions(o.lr));
    for (int step = 0; step < o.steps; ++step) {
      adam.zero_grad();
      const torch::Tensor out = part.Forward(x);
      torch::Tensor loss = torch::mse_loss(out.reshape(target.sizes()), target);
      if (o.tv > 0 && x.dim() == 4) loss = loss + o.tv * TotalVariation(x);
      loss.backward();
      adam.step();
      torch::NoGradGuard no_grad;
      x.clamp_(o.lo, o.hi);
    }
  });
  RETURN_IF_ERROR(s);
  return FromTorch(x);
}

StatusOr<UpdateInversion> InvertUpdate(const ModelSpec& spec, const ParameterSet& model, const ParameterSet& update,
                                       double lr, int64_t batch, const InversionOptions& o) {
  if (spec.text() || spec.input_shape.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("gradient inversion is for image models; model ", spec.name,
                                                   " does not read images"));
  }
  if (!(lr > 0) || batch < 1) return absl::InvalidArgumentError("gradient inversion needs lr > 0 and a batch");
  ASSIGN_OR_RETURN(std::vector<TorchStage> stages, BuildTorchStages(spec));
  // The trainable tensors in float64 (so that every op has a second derivative), and
  // each one's gradient as the update gives it.
  std::vector<torch::Tensor> params, target;
  torch::Tensor bias;  // the last layer's bias gradient
  Status s = Catch([&] {
    torch::NoGradGuard no_grad;
    for (TorchStage& st : stages) {
      st.train(false);
      for (auto& [name, t] : st.parameters()) {
        const Tensor* value = model.Find(name);
        TORCH_CHECK(value != nullptr && static_cast<int64_t>(value->values.size()) == t.numel(),
                    "the recorded model has no ", name, " of its shape");
        const bool trainable = t.requires_grad();
        t.set_data(torch::from_blob(const_cast<float*>(value->values.data()), t.sizes(), torch::kFloat32)
                       .to(torch::kFloat64));
        if (!trainable) continue;
        const Tensor* delta = update.Find(name);
        TORCH_CHECK(delta != nullptr && delta->values.size() == value->values.size(), "the update has no ", name,
                    " of its shape");
        params.push_back(t);
        target.push_back(torch::from_blob(const_cast<float*>(delta->values.data()), t.sizes(), torch::kFloat32)
                             .to(torch::kFloat64) / -lr);
        if (t.dim() == 1 && t.size(0) == spec.num_classes) bias = target.back();
      }
    }
  });
  RETURN_IF_ERROR(s);
  if (!bias.defined()) return absl::InvalidArgumentError("the model has no output bias to read labels from");
  UpdateInversion out;
  {
    // A label's output gradient, softmax - 1, is the only negative one for a single example.
    const torch::Tensor order = bias.argsort();
    const int64_t negative = std::max<int64_t>(1, bias.lt(0).sum().item<int64_t>());
    for (int64_t i = 0; i < batch; ++i) out.labels.push_back(order[i % negative].item<int64_t>());
  }
  std::vector<int64_t> shape = {batch};
  shape.insert(shape.end(), spec.input_shape.begin(), spec.input_shape.end());
  torch::Tensor x;
  s = Catch([&] {
    torch::manual_seed(o.seed);
    x = (0.5 * torch::randn(shape, torch::kFloat64)).clamp(o.lo, o.hi).requires_grad_(true);
    const torch::Tensor y = torch::tensor(out.labels, torch::kInt64);
    double target_norm = 0;
    for (const auto& t : target) target_norm += t.pow(2).sum().item<double>();
    target_norm = std::sqrt(target_norm);
    torch::optim::Adam adam({x}, torch::optim::AdamOptions(o.lr));
    for (int step = 0; step < o.steps; ++step) {
      adam.zero_grad();
      torch::Tensor h = x;
      for (const TorchStage& st : stages) h = st.forward(h);
      const torch::Tensor loss = torch::cross_entropy_loss(h, y);
      const std::vector<torch::Tensor> g = torch::autograd::grad({loss}, params, {}, true, true);
      torch::Tensor dot = torch::zeros({}, torch::kFloat64), norm = torch::zeros({}, torch::kFloat64);
      for (size_t i = 0; i < g.size(); ++i) {
        dot = dot + (g[i] * target[i]).sum();
        norm = norm + g[i].pow(2).sum();
      }
      torch::Tensor match = 1 - dot / (norm.sqrt() * target_norm + 1e-12);
      if (o.tv > 0) match = match + o.tv * TotalVariation(x);
      match.backward();
      adam.step();
      torch::NoGradGuard no_grad;
      x.clamp_(o.lo, o.hi);
    }
  });
  RETURN_IF_ERROR(s);
  out.inputs = FromTorch(x.to(torch::kFloat32));
  return out;
}

struct FeatureSpaceHijack::Impl {
  int cut = 0;
  std::vector<TorchStage> pilot;
  torch::nn::Sequential decoder{nullptr}, discriminator{nullptr};
  std::unique_ptr<torch::optim::Adam> adam_pilot, adam_d;
  torch::Tensor aux;
  std::vector<int64_t> act_shape;  // one example's
  std::mt19937_64 rng;
  float lo = 0, hi = 0;
  std::mutex mu;

  torch::Tensor Pilot(torch::Tensor x) const {
    for (const TorchStage& s : pilot) x = s.forward(x);
    return x;
  }
  torch::Tensor Decode(const torch::Tensor& z) {
    std::vector<int64_t> shape = {z.size(0)};
    shape.insert(shape.end(), aux.sizes().begin() + 1, aux.sizes().end());
    return decoder->forward(z.reshape({z.size(0), -1})).reshape(shape);
  }
  torch::Tensor Discriminate(const torch::Tensor& z) { return discriminator->forward(z.reshape({z.size(0), -1})); }
  Status CheckShape(const Activations& a) const {
    if (a.batch() < 1 || std::vector<int64_t>(a.shape.begin() + 1, a.shape.end()) != act_shape) {
      return absl::InvalidArgumentError("activations of another shape than the hijacked cut's");
    }
    return absl::OkStatus();
  }
};

FeatureSpaceHijack::FeatureSpaceHijack(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FeatureSpaceHijack::~FeatureSpaceHijack() = default;
int FeatureSpaceHijack::cut() const { return impl_->cut; }

StatusOr<std::unique_ptr<FeatureSpaceHijack>> FeatureSpaceHijack::Create(const ModelSpec& spec, int cut,
                                                                          const Activations& aux,
                                                                          const HijackOptions& o) {
  if (spec.text()) return absl::InvalidArgumentError("feature-space hijacking reconstructs images and tables, not tokens");
  if (aux.batch() < 2) return absl::InvalidArgumentError("feature-space hijacking needs auxiliary inputs");
  if (std::vector<int64_t>(aux.shape.begin() + 1, aux.shape.end()) != spec.input_shape) {
    return absl::InvalidArgumentError("the auxiliary inputs are not the model's");
  }
  auto impl = std::make_unique<Impl>();
  impl->cut = cut;
  impl->lo = o.lo, impl->hi = o.hi;
  impl->rng.seed(o.seed);
  torch::manual_seed(o.seed);
  ModelSpec pilot_spec = spec;  // the pilot is the attacker's own: not the model's initial weights
  pilot_spec.seed = spec.seed + 1000003;
  ASSIGN_OR_RETURN(impl->pilot, BuildTorchStages(pilot_spec, 0, cut));
  if (cut < 1 || static_cast<int>(impl->pilot.size()) <= cut) {
    return absl::InvalidArgumentError(absl::StrCat("cut ", cut, " is not inside model ", spec.name));
  }
  impl->pilot.resize(cut);
  impl->aux = ToTorch(aux);
  Status s = Catch([&] {
    std::vector<torch::Tensor> params;
    for (TorchStage& st : impl->pilot) {
      st.train(true);
      for (auto& [name, t] : st.parameters()) params.push_back(t);
    }
    torch::Tensor z;
    {
      torch::NoGradGuard no_grad;
      z = impl->Pilot(impl->aux.slice(0, 0, 1));
    }
    impl->act_shape.assign(z.sizes().begin() + 1, z.sizes().end());
    const int64_t z_elements = z[0].numel(), x_elements = impl->aux[0].numel();
    impl->decoder = Mlp(z_elements, o.hidden, x_elements);
    impl->discriminator = Mlp(z_elements, std::max(16, o.hidden / 4), 1);
    for (const auto& p : impl->decoder->parameters()) params.push_back(p);
    impl->adam_pilot = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(o.lr));
    impl->adam_d = std::make_unique<torch::optim::Adam>(impl->discriminator->parameters(), torch::optim::AdamOptions(o.lr_d));
  });
  RETURN_IF_ERROR(s);
  return std::unique_ptr<FeatureSpaceHijack>(new FeatureSpaceHijack(std::move(impl)));
}

StatusOr<FeatureSpaceHijack::Step> FeatureSpaceHijack::Train(const Activations& activations) {
  Impl& m = *impl_;
  RETURN_IF_ERROR(m.CheckShape(activations));
  std::lock_guard<std::mutex> lock(m.mu);
  std::uniform_int_distribution<int64_t> pick(0, m.aux.size(0) - 1);
  std::vector<int64_t> idx(static_cast<size_t>(std::min<int64_t>(activations.batch(), m.aux.size(0))));
  for (int64_t& i : idx) i = pick(m.rng);
  Step out;
  Status s = Catch([&] {
    const torch::Tensor x_pub = m.aux.index_select(0, torch::tensor(idx, torch::kInt64));
    // The pilot and its decoder: an autoencoder on the auxiliary inputs.
    m.adam_pilot->zero_grad();
    const torch::Tensor z_pub = m.Pilot(x_pub);
    torch::mse_loss(m.Decode(z_pub), x_pub).backward();
    m.adam_pilot->step();
    // The discriminator: the pilot's features are real, the device's fake.
    const torch::Tensor z_priv = ToTorch(activations).requires_grad_(true);
    m.adam_d->zero_grad();
    const torch::Tensor real = m.Discriminate(z_pub.detach()), fake = m.Discriminate(z_priv.detach());
    ((torch::binary_cross_entropy_with_logits(real, torch::ones_like(real)) +
      torch::binary_cross_entropy_with_logits(fake, torch::zeros_like(fake))) / 2).backward();
    m.adam_d->step();
    // The device's loss: its features should pass for the pilot's.
    const torch::Tensor d = m.Discriminate(z_priv);
    const torch::Tensor loss = torch::binary_cross_entropy_with_logits(d, torch::ones_like(d));
    out.grad = FromTorch(torch::autograd::grad({loss}, {z_priv})[0]);
    out.loss = loss.item<double>();
  });
  RETURN_IF_ERROR(s);
  return out;
}

StatusOr<Activations> FeatureSpaceHijack::Reconstruct(const Activations& activations) const {
  Impl& m = *impl_;  // the decoder runs without changing
  RETURN_IF_ERROR(m.CheckShape(activations));
  std::lock_guard<std::mutex> lock(m.mu);
  torch::Tensor out;
  Status s = Catch([&] {
    torch::NoGradGuard no_grad;
    out = m.Decode(ToTorch(activations)).clamp(m.lo, m.hi);
  });
  RETURN_IF_ERROR(s);
  return FromTorch(out);
}

}  // namespace cleave
