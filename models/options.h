// The model section of a job config (docs/configuration.md): their options,
// each field's default, and how the section is read and checked (core/config_section.h;
// the job layer registers both, job/job.cc). Torch-free.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/config_section.h"
#include "core/names.h"

namespace cleave {

// The built-in decoder's size (model.gpt; models/gpt.h).
struct GptConfig {
  int64_t vocab = 256;    // model.gpt.vocab: the tokenizer's vocabulary
  int64_t context = 128;  // model.gpt.context: the longest sequence, in tokens
  int layers = 4;         // model.gpt.layers
  int heads = 4;          // model.gpt.heads
  int64_t dim = 128;      // model.gpt.dim: the residual stream's width, divisible by heads
  bool tie = false;       // model.gpt.tie: the head reuses the token embedding (as GPT-2)
};

// LoRA adapters (Hu et al. 2021) on the decoder's projections (model.lora): W x + b
// becomes W x + b + (alpha / rank) B A x, with A and B trained and everything else
// frozen; only the adapters are trained, uploaded, aggregated and checkpointed.
struct LoraConfig {
  int rank = 0;          // model.lora.rank: 0 = no adapters
  double alpha = 16;     // model.lora.alpha: the adapters' scale is alpha / rank
  // model.lora.targets: the projections that get adapters (the model's module names:
  // gpt's attn.c_attn, ...; hf's q_proj, ..., down_proj); empty = all of them
  std::vector<std::string> targets;
  double dropout = 0;    // model.lora.dropout: on the adapters' input, in training

  bool enabled() const { return rank > 0; }
  // Whether the projection `name` gets an adapter (empty targets: every projection).
  bool Targets(const std::string& name) const {
    return targets.empty() || std::find(targets.begin(), targets.end(), name) != targets.end();
  }
};

// The projections LoRA can adapt: gpt's four, hf's seven.
const NameTable& LoraTargetNames();

// Interoperable architectures (Krouka & Bennis; model.name interop): each device keeps a
// private base of its own architecture (a built-in model without its classifier layer)
// and a fusion layer mapping its features to `width`; the shared block on top (two
// layers of `width`, then the classes) is all that travels and is averaged.
struct InteropConfig {
  std::string base = "cnn";  // model.interop.base: a device's base unless clients names it
  int64_t width = 64;        // model.interop.width: the fusion's output, the shared block's width
  struct Client {
    std::string name;  // cleave-client --name
    std::string base;
  };
  std::vector<Client> clients;  // model.interop.clients: [{name, base}, ...]
  // The base of a device named `name`.
  const std::string& BaseOf(const std::string& name) const {
    for (const Client& c : clients) {
      if (c.name == name) return c.base;
    }
    return base;
  }
};

// The architectures a private base may have.
const NameTable& InteropBaseNames();

struct ModelConfig {
  std::string name = "lenet5";   // model.name: a Models() name (models/builtin_models.h) |
                                 //   torchscript
  std::string path;              // model.path: TorchScript archive, for name=torchscript
  std::vector<int64_t> input = {1, 28, 28};  // model.input: one example's shape
  int classes = 10;              // model.classes: outputs (labels are in [0, classes))
  // model.personal: globs over tensor names (FedPer / FedBN): tensors that stay on each
  // device, never uploaded or averaged
  std::vector<std::string> personal;
  GptConfig gpt{};               // model.gpt, for name=gpt
  LoraConfig lora{};             // model.lora, for name=gpt
  InteropConfig interop{};       // model.interop, for name=interop
  // model.quantize: none | int8 | nf4: the frozen base of a LoRA hf model held quantized
  // (QLoRA) on devices and server, int8 per output channel or NF4 in blocks of 64,
  // dequantized inside each matmul; it travels to devices quantized
  std::string quantize = "none";
  bool double_quant = false;  // model.double_quant: nf4's absmax values quantized too
  // model.weights: the starting weights, a safetensors file (GPT-2's layout for gpt,
  // the model's own tensor names otherwise); "" = initialised from run.seed
  std::string weights;
  // model.batch_norm: running | static: how resnet's batch normalization normalises in
  // evaluation: by running statistics kept in training (PyTorch's default), or by each
  // batch's own (HeteroFL's static batch normalization: no statistics are kept, so none
  // travel or are averaged; width-scaled submodels need it)
  std::string batch_norm = "running";
};

// The sections (core/config_section.h). CheckModel resolves nothing by name: model.name
// is checked where the model is built (it may be a TorchScript archive).
void ReadModel(ConfigSection& s, ModelConfig& c);
// The codec of model.quantize (ModelSpec::quantize): "" for none, "int8:channel", "nf4",
// "nf4:dq" (double_quant).
std::string QuantizeCodec(const ModelConfig& c);
Status CheckModel(ModelConfig& c);

}  // namespace cleave
