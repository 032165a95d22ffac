// What code outside models/ asks of a model kind (model.name) or a loss (train.loss),
// instead of comparing names: the traits each kind is registered with. LibTorch-free,
// so the job layer checks a config by them without building anything.
//
// A kind of one's own is one call, AddModel (models/builtin_models.h): its builder in
// Models() and its traits here; every layer that needs to know what it is asks here.
// The structure check (scripts/check_structure.py) refuses a model name compared
// outside models/.
#pragma once

#include <string>

#include "core/registry.h"

namespace cleave {

enum class ModelInput { kAny, kImages, kTokens };

struct ModelTraits {
  // What the model takes: kImages needs a [C, H, W] model.input; kTokens reads token
  // ids (text data, sized by ModelSpec::gpt, LoRA adapters); both need model.classes >= 1
  // unless kTokens.
  ModelInput input = ModelInput::kAny;
  bool scales = false;  // has width-scaled submodels (ModelSpec::width, section width)
  // Built from a Hugging Face folder (model.path): its config.json travels in the
  // model's description, its weights are read from the folder unless model.weights is
  // set, its frozen base may be quantized (model.quantize) and its embedding may have
  // rows the tokenizer never uses.
  bool hf_folder = false;
  // The GPT-2 decoder (models/gpt.h): sized by model.gpt, written in GPT-2's
  // safetensors layout, its cut activations attacked by token recovery.
  bool gpt2 = false;
  bool batch_norm = false;  // holds BatchNorm layers (model.batch_norm: running | static)
  // A TorchScript archive of one's own (model.path), which devices fetch as a blob.
  bool scripted = false;
  // A device's own tensors, never sent nor averaged (interop: each device's base and
  // fusion layer); null: every tensor is shared.
  bool (*private_tensor)(const std::string& tensor_name) = nullptr;

  bool tokens() const { return input == ModelInput::kTokens; }
  bool has_private_tensors() const { return private_tensor != nullptr; }
};

// Every model kind's traits, by model.name: the built-in kinds and torchscript, then
// those added with AddModel.
Registry<ModelTraits>& ModelKinds();

// The traits of model kind `name`, and whether it is one (an unknown name has none).
struct KnownTraits : ModelTraits {
  bool known = false;
};
KnownTraits ModelTraitsOf(const std::string& name);

// The loss that is a scripted module of one's own (train.loss_path), which devices
// fetch as a blob; models/losses.cc registers it under this name.
inline constexpr char kScriptedLoss[] = "torchscript";
inline bool ScriptedLoss(const std::string& name) { return name == kScriptedLoss; }

}  // namespace cleave
