// The built-in architectures (models/builtin_models.h) and the registry that names them.
#include "models/builtin_models.h"

#include <torch/torch.h>

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
  return BuildLlama(c, {spec.lora, spec.quantize, begin, end});
}

nn::Sequential BuildHf(const ModelSpec& spec) { return BuildHfStages(spec, 0, -1); }

}  // namespace

Registry<ModelKind>& Models() {
  static Registry<ModelKind>* models = [] {
    auto* r = new Registry<ModelKind>("model.name");
    r->AddBuiltin("mlp", {ModelInput::kAny, BuildMlp});
    r->AddBuiltin("lenet5", {ModelInput::kImages, BuildLeNet5});
    r->AddBuiltin("cnn", {ModelInput::kImages, BuildCnn});
    r->AddBuiltin("vgg", {ModelInput::kImages, BuildVgg});
    r->AddBuiltin("resnet", {ModelInput::kImages, BuildResNet});
    r->AddBuiltin("gpt", {ModelInput::kTokens, BuildGpt, CheckGptSpec});
    r->AddBuiltin("hf", {ModelInput::kTokens, BuildHf, CheckHfSpec, BuildHfStages});
    return r;
  }();
  return *models;
}

std::vector<std::string> BuiltinModelNames() { return Models().Names(); }

// The built-in model `spec` names. INVALID_ARGUMENT for an unknown name or an input
// shape it cannot take.
StatusOr<nn::Sequential> BuildBuiltin(const ModelSpec& spec, int begin, int end) {
  const ModelKind* kind = Models().Find(spec.name);
  if (kind == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("model.name: unknown '", spec.name,
                                                   "'; choose one of ",
                                                   absl::StrJoin(BuiltinModelNames(), ", "),
                                                   ", torchscript"));
  }
  const std::string shape = absl::StrJoin(spec.input_shape, "x");
  if (kind->check != nullptr) RETURN_IF_ERROR(kind->check(spec));
  if (!spec.quantize.empty() && spec.name != "hf") {
    return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, " has no quantized base (model.quantize is for hf)"));
  }
  const bool images = kind->input == ModelInput::kImages;
  if (kind->input != ModelInput::kTokens &&
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
