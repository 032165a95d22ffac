// The built-in architectures (models/builtin_models.h) and the registry that names them.
#include "models/builtin_models.h"

#include <torch/torch.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/fast_trainer.h"
#include "models/gpt.h"
#include "models/llama.h"

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

// HeteroFL's scaler (Diao et al. 2021), for models without normalization: a width-r
// submodel's layer whose inputs were cut sums r of the terms the whole model's does.
// HeteroFL divides its output by r in training and lets (static) batch normalization
// absorb the rest and rescale at inference; these models have none, and dividing by r
// left the narrow tiers' outputs 1/sqrt(r) times too spread per layer (4x at r = 1/16):
// they never learned (bench/width.sh: a width-1/16 LeNet-5 stayed at chance). So the
// scaler divides by sqrt(r), which keeps the spread of a sum of zero-mean terms, follows
// the layers whose inputs shrink, and applies in evaluation too.
struct ScalerImpl : nn::Module {
  explicit ScalerImpl(double width) : width(width) {}
  torch::Tensor forward(torch::Tensor x) { return x / std::sqrt(width); }
  double width;
};
TORCH_MODULE(Scaler);

// A hidden layer's width in the spec's submodel.
int64_t Width(const ModelSpec& s, int64_t n) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(s.width * static_cast<double>(n) - 1e-9)));
}

// The scaler makes each weight's gradient in the layer before it 1/sqrt(r) times what
// the same product would get without it: those gradients are multiplied by sqrt(r)
// again, so that a weight steps as the whole model's would (with momentum SGD the
// narrow tiers diverged without it).
template <typename Layer>
Layer Rescaled(const ModelSpec& s, Layer layer) {
  WidthScale(s.width).Rescale(*layer);
  return layer;
}

// A stage of `layer`, whose inputs a submodel cuts, then its scaler, then `rest`.
template <typename Layer, typename... Rest>
Stage Scaled(const ModelSpec& s, Layer layer, Rest... rest) {
  if (s.width >= 1) return Stage(layer, rest...);
  return Stage(Rescaled(s, layer), Scaler(s.width), rest...);
}
// The same after a flatten.
template <typename Layer, typename... Rest>
Stage FlatScaled(const ModelSpec& s, Layer layer, Rest... rest) {
  if (s.width >= 1) return Stage(nn::Flatten(), layer, rest...);
  return Stage(nn::Flatten(), Rescaled(s, layer), Scaler(s.width), rest...);
}

// Layers are built one statement at a time, first to last: each draws its initial
// weights from the seeded generator in turn. (Built as the arguments of one call, their
// order would be the compiler's: GCC builds them last to first, clang first to last.)

nn::Sequential BuildMlp(const ModelSpec& s) {
  nn::Sequential seq;
  const int64_t h = Width(s, 200);
  seq->push_back(Stage(nn::Flatten(), nn::Linear(Product(s.input_shape), h), nn::ReLU()));
  seq->push_back(Scaled(s, nn::Linear(h, h), nn::ReLU()));
  seq->push_back(Scaled(s, nn::Linear(h, s.num_classes)));
  return seq;
}

nn::Sequential BuildLeNet5(const ModelSpec& s) {
  nn::Sequential seq;
  const int64_t c1 = Width(s, 6), c2 = Width(s, 16), f1 = Width(s, 120), f2 = Width(s, 84);
  seq->push_back(Stage(nn::Conv2d(nn::Conv2dOptions(s.input_shape[0], c1, 5)), ReluMaxPool()));
  seq->push_back(Scaled(s, nn::Conv2d(nn::Conv2dOptions(c1, c2, 5)), ReluMaxPool()));
  const int64_t flat = FlatSize(seq, s.input_shape);
  seq->push_back(FlatScaled(s, nn::Linear(flat, f1), nn::ReLU()));
  seq->push_back(Scaled(s, nn::Linear(f1, f2), nn::ReLU()));
  seq->push_back(Scaled(s, nn::Linear(f2, s.num_classes)));
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
  const int64_t c1 = Width(s, 32), c2 = Width(s, 64), f1 = Width(s, 128);
  seq->push_back(Stage(nn::Conv2d(nn::Conv2dOptions(s.input_shape[0], c1, 3).padding(1)), ReluMaxPool()));
  seq->push_back(Scaled(s, nn::Conv2d(nn::Conv2dOptions(c1, c2, 3).padding(1)), ReluMaxPool()));
  const int64_t flat = FlatSize(seq, s.input_shape);
  seq->push_back(FlatScaled(s, nn::Linear(flat, f1), nn::ReLU()));
  seq->push_back(Scaled(s, nn::Linear(f1, s.num_classes)));
  return seq;
}

// HeteroFL's scaler as the paper defines it, for models with (static) batch
// normalization: a width-r submodel's layer whose inputs were cut divides its output by
// r in training and not in evaluation; the normalization after it absorbs the rest.
struct TrainScalerImpl : nn::Module {
  explicit TrainScalerImpl(double width) : width(width) {}
  torch::Tensor forward(torch::Tensor x) { return is_training() ? x / width : x; }
  double width;
};
TORCH_MODULE(TrainScaler);

// Batch normalization over `channels`: with running statistics, or static (none kept;
// each batch normalised by its own, in evaluation too).
nn::BatchNorm2d Norm(const ModelSpec& s, int64_t channels) {
  return nn::BatchNorm2d(nn::BatchNorm2dOptions(channels).track_running_stats(!s.static_bn));
}

// He et al.'s basic block: conv-BN-ReLU-conv-BN plus the input (a 1x1 conv + BN when
// the shape changes), then ReLU. In a width-r submodel (r < 1) each convolution's output
// passes HeteroFL's scaler before its normalization.
struct BasicBlockImpl : nn::Module {
  BasicBlockImpl(const ModelSpec& s, int64_t in, int64_t out, int64_t stride)
      : conv1(register_module(
            "conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false)))),
        bn1(register_module("bn1", Norm(s, out))),
        conv2(register_module("conv2",
                              nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", Norm(s, out))),
        scale(s.width < 1 ? register_module("scale", TrainScaler(s.width)) : TrainScaler(nullptr)) {
    if (stride != 1 || in != out) {
      shortcut = register_module(
          "shortcut",
          nn::Sequential(nn::Conv2d(nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)), Norm(s, out)));
    }
  }
  torch::Tensor Scaled(torch::Tensor x) { return scale ? scale->forward(x) : x; }
  torch::Tensor forward(torch::Tensor x) {
    auto y = bn2(Scaled(conv2(torch::relu(bn1(Scaled(conv1(x)))))));
    torch::Tensor skip = x;
    if (shortcut) skip = shortcut[1]->as<nn::BatchNorm2d>()->forward(Scaled(shortcut[0]->as<nn::Conv2d>()->forward(x)));
    return torch::relu(y + skip);
  }
  nn::Conv2d conv1;
  nn::BatchNorm2d bn1;
  nn::Conv2d conv2;
  nn::BatchNorm2d bn2;
  TrainScaler scale;
  nn::Sequential shortcut{nullptr};
};
TORCH_MODULE(BasicBlock);

// A width-r submodel keeps ceil(r n) of each block's n channels; the stem's inputs and
// the classes stay whole.
nn::Sequential BuildResNet(const ModelSpec& s) {
  nn::Sequential seq;
  const int64_t c1 = Width(s, 16), c2 = Width(s, 32), c3 = Width(s, 64);
  seq->push_back(Stage(nn::Conv2d(nn::Conv2dOptions(s.input_shape[0], c1, 3).padding(1).bias(false)),
                       Norm(s, c1), nn::ReLU()));
  seq->push_back(Stage(BasicBlock(s, c1, c1, 1)));
  seq->push_back(Stage(BasicBlock(s, c1, c2, 2)));
  seq->push_back(Stage(BasicBlock(s, c2, c3, 2)));
  seq->push_back(Stage(nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)), nn::Flatten(),
                       nn::Linear(c3, s.num_classes)));
  torch::NoGradGuard no_grad;  // He initialisation of the convolutions, as torchvision's
  for (auto& p : seq->named_parameters(/*recurse=*/true)) {
    if (p.value().dim() == 4) {
      torch::nn::init::kaiming_normal_(p.value(), 0, torch::kFanOut, torch::kReLU);
    }
  }
  return seq;
}

// Interoperable architectures (Krouka & Bennis): four stages whatever the base, so that
// the shared block's tensors have the same names on every device. Stage 0: the base (its
// built-in model's stages but the last, the classifier); stage 1: the fusion layer,
// the base's features to the common width; stages 2 and 3: the shared block, a hidden
// layer of that width and the classes.
nn::Sequential BuildInterop(const ModelSpec& s) {
  ModelSpec base_spec = s;
  base_spec.name = s.interop_base;
  nn::Sequential whole = Models().Find(base_spec.name)->build(base_spec);  // checked by CheckInteropSpec
  Stage base;
  for (size_t i = 0; i + 1 < whole->size(); ++i) base->push_back(whole->ptr<StageImpl>(i));
  nn::Sequential seq;
  seq->push_back(base);
  const int64_t features = FlatSize(seq, s.input_shape);
  const int64_t w = s.interop_width;
  seq->push_back(Stage(nn::Flatten(), nn::Linear(features, w), nn::ReLU()));
  seq->push_back(Stage(nn::Linear(w, w), nn::ReLU()));
  seq->push_back(Stage(nn::Linear(w, s.num_classes)));
  return seq;
}

Status CheckInteropSpec(const ModelSpec& spec) {
  RETURN_IF_ERROR(InteropBaseNames().Check(spec.interop_base));
  if (spec.interop_width < 1) return absl::InvalidArgumentError("model interop: the width must be >= 1");
  if (spec.interop_base != "mlp" && spec.input_shape.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat("model interop: base ", spec.interop_base, " needs [C, H, W] input"));
  }
  return absl::OkStatus();
}

Status CheckLoraOf(const std::string& model, const LoraConfig& lora,
                   const std::vector<std::string>& projections) {
  if (lora.rank < 0 || lora.rank > 4096 || !(lora.alpha > 0) || !(lora.dropout >= 0 && lora.dropout < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA rank ", lora.rank, ", alpha ", lora.alpha,
                                                   ", dropout ", lora.dropout, " (rank in [0, 4096], "
                                                   "alpha > 0, dropout in [0, 1))"));
  }
  for (const std::string& t : lora.targets) {
    RETURN_IF_ERROR(LoraTargetNames().Check(t));
    if (std::find(projections.begin(), projections.end(), t) == projections.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model.lora.targets: ", model, " has no projection ",
                                                     t, "; its are ", absl::StrJoin(projections, ", ")));
    }
  }
  return absl::OkStatus();
}

Status CheckGptSpec(const ModelSpec& spec) {
  const GptConfig& g = spec.gpt;
  RETURN_IF_ERROR(CheckLoraOf("gpt", spec.lora, {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}));
  if (g.vocab < 2 || g.vocab > (1 << 24) || g.context < 1 || g.layers < 1 || g.heads < 1 ||
      g.dim < 1 || g.dim % g.heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model gpt cannot have vocab ", g.vocab, ", context ", g.context, ", ", g.layers,
        " layers, ", g.heads, " heads of width ", g.dim,
        " (vocab in [2, 2^24], the rest >= 1, dim divisible by heads)"));
  }
  return absl::OkStatus();
}

// model hf: the Llama-family decoder of the folder's config.json (models/llama.h).
Status CheckHfSpec(const ModelSpec& spec) {
  RETURN_IF_ERROR(ParseHfConfig(spec.hf_config, "config.json").status());
  if (!spec.quantize.empty()) {
    if (spec.quantize != "int8:channel" && spec.quantize != "nf4" && spec.quantize != "nf4:dq") {
      return absl::InvalidArgumentError(absl::StrCat("model hf cannot hold its base in codec '",
                                                     spec.quantize, "' (int8:channel, nf4, nf4:dq)"));
    }
    if (!spec.lora.enabled()) {
      return absl::InvalidArgumentError(
          "a quantized base (model.quantize) is frozen: it needs LoRA adapters (model.lora.rank)");
    }
  }
  return CheckLoraOf("hf", spec.lora,
                     {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"});
}

nn::Sequential BuildHfStages(const ModelSpec& spec, int begin, int end) {
  DecoderConfig c = *ParseHfConfig(spec.hf_config, "config.json");  // CheckHfSpec'd
  c.context = std::min(c.context, spec.gpt.context);
  return BuildLlama(c, {spec.lora, spec.quantize, begin, end, spec.width, spec.weights_follow});
}

nn::Sequential BuildHf(const ModelSpec& spec) { return BuildHfStages(spec, 0, -1); }

}  // namespace

Registry<ModelKind>& Models() {
  static Registry<ModelKind>* models = [] {
    auto* r = new Registry<ModelKind>("model.name");
    // Their traits: models/kinds.cc (ModelKindsTest holds the two lists to one another).
    r->AddBuiltin("mlp", {BuildMlp});
    r->AddBuiltin("lenet5", {BuildLeNet5});
    r->AddBuiltin("cnn", {BuildCnn});
    r->AddBuiltin("vgg", {BuildVgg});
    r->AddBuiltin("resnet", {BuildResNet});
    r->AddBuiltin("gpt", {BuildGpt, CheckGptSpec});
    r->AddBuiltin("hf", {BuildHf, CheckHfSpec, BuildHfStages});
    r->AddBuiltin("interop", {BuildInterop, CheckInteropSpec});
    return r;
  }();
  return *models;
}

Status AddModel(const std::string& name, ModelKind kind, ModelTraits traits) {
  if (Models().Has(name) || ModelKinds().Has(name)) {
    return absl::AlreadyExistsError(absl::StrCat("model.name: '", name, "' is registered already"));
  }
  RETURN_IF_ERROR(Models().Add(name, kind));
  return ModelKinds().Add(name, traits);
}

std::vector<std::string> BuiltinModelNames() { return Models().Names(); }

// The built-in model `spec` names. INVALID_ARGUMENT for an unknown name or an input
// shape it cannot take.
StatusOr<nn::Sequential> BuildBuiltin(const ModelSpec& spec, int begin, int end) {
  const ModelKind* kind = Models().Find(spec.name);
  const KnownTraits traits = ModelTraitsOf(spec.name);
  if (kind == nullptr || !traits.known) {
    return absl::InvalidArgumentError(absl::StrCat("model.name: unknown '", spec.name,
                                                   "'; choose one of ",
                                                   absl::StrJoin(BuiltinModelNames(), ", "),
                                                   ", torchscript"));
  }
  const std::string shape = absl::StrJoin(spec.input_shape, "x");
  if (kind->check != nullptr) RETURN_IF_ERROR(kind->check(spec));
  if (!(spec.width > 0 && spec.width <= 1) || (spec.width < 1 && !traits.scales)) {
    return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, " has no width-", spec.width,
                                                   " submodel (widths in (0, 1] for mlp, lenet5, cnn, resnet, gpt and hf)"));
  }
  if (!spec.quantize.empty() && !traits.hf_folder) {
    return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, " has no quantized base (model.quantize is for hf)"));
  }
  const bool images = traits.input == ModelInput::kImages;
  if (!traits.tokens() &&
      (spec.input_shape.empty() || Product(spec.input_shape) <= 0 || spec.num_classes < 1 ||
       (images && spec.input_shape.size() != 3))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", spec.name, " cannot take input ", shape, " with ", spec.num_classes, " classes",
        images ? " (it needs [C, H, W])" : ""));
  }
  torch::manual_seed(spec.seed);
  try {
    if (kind->build_stages != nullptr && (begin > 0 || end >= 0)) return kind->build_stages(spec, begin, end);
    return kind->build(spec);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, " cannot take input ",
                                                   shape, " (too small?): ",
                                                   e.what_without_backtrace()));
  }
}

}  // namespace cleave
