// Hugging Face model folders (model.name: hf, model.path: DIR): config.json (the
// decoder's shape, models/hf_config.h) and the weights, in model.safetensors or in the
// shards model.safetensors.index.json lists (F32, F16 or BF16). Torch-free.
#pragma once

#include <string>
#include <vector>

#include "core/parameter_set.h"
#include "core/status.h"
#include "models/model.h"

namespace cleave {

// DIR/config.json's text; NOT_FOUND naming the file, INVALID_ARGUMENT for one that is not
// a regular file of at most 16 MiB.
StatusOr<std::string> ReadHfConfig(const std::string& dir);

// Makes `spec` model hf of `config_json` (`what` names it in errors): hf_config and the
// fields the code for token models reads (gpt.vocab, layers, heads, dim, tie, and
// gpt.context: the longest sequence it takes, spec.gpt.context as the job gives it
// (model.gpt.context) but at most config.json's max_position_embeddings).
Status SetHfModel(ModelSpec& spec, std::string config_json, const std::string& what);

// Before a model of DIR is built: DIR's safetensors headers (only the headers; nothing is
// allocated for the weights) hold every tensor the decoder of `config_json` has
// (HfTensorShapes) with its shape. INVALID_ARGUMENT naming the file and the tensor
// otherwise (a tiny folder whose config.json states a 7B model is refused here, not
// after gigabytes are allocated for it).
Status CheckHfFolder(const std::string& dir, const std::string& config_json);

// Whether the decoder of `config_json` (`what` names it) fits in `budget_bytes` as
// float32: RESOURCE_EXHAUSTED naming its size and the budget otherwise, before anything
// is allocated for it.
Status CheckHfModelFits(const std::string& config_json, const std::string& what, int64_t budget_bytes,
                        const std::string& budget_name);

// What a process that builds the model of DIR checks first: CheckHfFolder when its
// weights come from DIR, then CheckHfModelFits against half of the memory it could hold
// (MemoryCeilingBytes: the model, and a copy of its weights).
Status CheckHfBeforeBuilding(const std::string& dir, const std::string& config_json, bool weights_from_folder);

// A stage tensor's name in the folder: "0.embed_tokens.weight" →
// "model.embed_tokens.weight"; block stage i: "i.X" → "model.layers.{i-1}.X"; the head
// stage (layers + 1): "norm.weight" → "model.norm.weight", "lm_head.weight" as it is.
// "" for a name outside the decoder's layout.
std::string HfTensorName(const std::string& stage_name, int layers);

// The tensors of `layout` (a model's or a part's, under stage names) from DIR's
// safetensors: each file memory-mapped, only the shards that hold a wanted tensor read,
// each tensor converted to float32 once and its mapped pages released behind it. Every
// tensor of `layout` must be in the folder with its shape, except LoRA adapters, which
// keep `layout`'s values. Errors name the file and the tensor.
StatusOr<ParameterSet> LoadHfWeights(const std::string& dir, const ParameterSet& layout, int layers);

// Where a tensor read from a folder goes: its stage name, its shape, and memory for its
// float32 values (a model part's own tensor).
struct HfTarget {
  std::string name;
  std::vector<int64_t> shape;
  float* values = nullptr;
};

// What LoadHfWeights does (into a copy of its layout), straight into `targets` (no LoRA
// adapters among them): each tensor
// converted from its mapped file into its target a slice at a time, each slice's pages
// released once read, so that loading holds nothing beside the targets but a slice.
// Errors as LoadHfWeights's; a target may be partly written when one is returned.
Status LoadHfInto(const std::string& dir, const std::vector<HfTarget>& targets, int layers);
// Targets for every tensor of `set` but its LoRA adapters, each its own values.
std::vector<HfTarget> HfTargetsOf(ParameterSet& set);

// The quantized weights of `layout` (a model's QuantizedBase, under stage names) from
// DIR's safetensors, each read as LoadHfWeights reads it and quantized in layout's codec
// before the next is read.
StatusOr<QuantizedSet> LoadHfQuantized(const std::string& dir, const QuantizedSet& layout, int layers);

// Writes a folder Hugging Face's from_pretrained reads: config.json and model.safetensors
// (F32) of `model` under the folder's names (no LoRA adapters: merge them first).
Status WriteHfFolder(const std::string& dir, const std::string& config_json,
                     const ParameterSet& model, int layers);

}  // namespace cleave
