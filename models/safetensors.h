// Safetensors (Hugging Face's tensor file format) and GPT-2's tensor layout, so that a
// GPT-2-family checkpoint can be fine-tuned and a trained decoder exported.
//
// A safetensors file: u64 little-endian N, an N-byte JSON header mapping each tensor's
// name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that
// follows; an optional "__metadata__" maps strings to strings), then the data.
// No LibTorch here.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/parameter_set.h"
#include "core/status.h"

namespace cleave {

// The tensors of a safetensors file, in the header's order, as float32 (F32, F16, BF16
// and F64 are read). DATA_LOSS for a truncated or inconsistent file, INVALID_ARGUMENT
// for another dtype; each names `what` (the file) and the tensor.
StatusOr<ParameterSet> ParseSafetensors(std::string_view bytes, const std::string& what);
// ParseSafetensors of the tensors `wanted` names only (every tensor's entry is still
// checked); `done`, when set, is told each converted tensor's bytes, so that a mapped
// file's pages can be released as soon as they are read. `into`, when set, is asked for
// each wanted tensor (its name and shape in the file) where its float32 values go: an
// error stops the parse, nullptr takes it into the result as usual, and memory for all
// of its values receives them instead, converted a slice at a time (`done` told each
// slice's bytes), so that the tensor is never whole anywhere else.
struct SafetensorsFilter {
  std::function<bool(const std::string& name)> wanted;
  std::function<void(const char* data, size_t size)> done;
  std::function<StatusOr<float*>(const std::string& name, const std::vector<int64_t>& shape)> into;
};
StatusOr<ParameterSet> ParseSafetensors(std::string_view bytes, const std::string& what,
                                        const SafetensorsFilter& filter);
// One tensor's entry in a safetensors header: its dtype, shape and where its bytes lie in
// the data after the header.
struct SafetensorsEntry {
  std::string name, dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};
// The header's entries, checked as ParseSafetensors checks them (the data is not read),
// in the order of their data.
StatusOr<std::vector<SafetensorsEntry>> SafetensorsEntries(std::string_view bytes, const std::string& what);

// `params` as an F32 safetensors file with `metadata`.
std::string SerializeSafetensors(const ParameterSet& params,
                                 const std::map<std::string, std::string>& metadata = {});

// Model gpt's tensors (models/gpt.h) under GPT-2's names: "wte.weight", "h.0.ln_1.weight",
// ..., "ln_f.bias", and "lm_head.weight" when untied.
ParameterSet ToGpt2Layout(const ParameterSet& model);
// The inverse, checked against the model's own tensors `layout` (Model::Parameters()):
// every name known (with or without GPT2LMHeadModel's "transformer." prefix; GPT-2's
// attention mask buffers "*.attn.bias" and "*.attn.masked_bias" are skipped, and so is
// "lm_head.weight" for a tied model), every shape the model's, every tensor present
// (an untied head missing from the file starts as a copy of wte, as GPT-2 ties them;
// LoRA adapters missing from it keep their values in `layout`).
// INVALID_ARGUMENT naming `what` and the tensor otherwise.
StatusOr<ParameterSet> FromGpt2Layout(const ParameterSet& file, const ParameterSet& layout,
                                      const std::string& what);

// The model with its LoRA adapters merged into the weights they adapt (W += scale A B
// for each "P.lora_A", "P.lora_B" beside "P.weight") and left out: the plain model's
// tensors. `model` unchanged when it has no adapters.
ParameterSet MergeLora(const ParameterSet& model, double scale);

// The model's starting weights from the safetensors file at `path` (model.weights):
// for model gpt in GPT-2's layout (FromGpt2Layout), for any other under the model's
// own tensor names (what `cleave export` writes), every tensor of `layout` present with
// its shape and no other. Errors name the file and the tensor.
StatusOr<ParameterSet> LoadWeights(const std::string& path, const std::string& model_name,
                                   const ParameterSet& layout);

}  // namespace cleave
