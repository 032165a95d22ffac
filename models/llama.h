// Internal to models/ (includes LibTorch): the Llama-family decoder (model.name: hf), as
// Hugging Face's transformers defines LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM and Qwen3ForCausalLM: token embedding; pre-norm blocks of RMSNorm,
// grouped-query causal self-attention with rotary position embeddings (rotate-half
// convention, rope_theta, llama3 or linear scaling; Qwen3's per-head q/k RMSNorm;
// Mistral's sliding window) and a SwiGLU MLP, each added to the residual stream; a final
// RMSNorm and the head, tied to the embedding or its own. Its shape is the folder's
// config.json (ModelSpec::hf_config, models/hf_config.h).
//
// Stages: the embedding, each block, then final norm + head, so split learning can cut
// between any two. Tensor names are Hugging Face's behind a stage prefix:
// "0.embed_tokens.weight"; block i is stage i + 1 with "input_layernorm.weight",
// "self_attn.{q,k,v,o}_proj.weight" (and .bias where the family has one),
// "self_attn.{q,k}_norm.weight" (qwen3), "post_attention_layernorm.weight",
// "mlp.{gate,up,down}_proj.weight"; stage layers + 1 holds "norm.weight" and, untied,
// "lm_head.weight". HfTensorName maps them to the folder's names.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "compression/quantized_set.h"
#include "models/hf_config.h"
#include "models/model.h"

namespace cleave {

struct LlamaBuild {
  LoraConfig lora;
  // A stateless codec (model.quantize: "int8:channel", "nf4", "nf4:dq") in which the
  // blocks' projection weights are held, frozen; "" = float32. Needs LoRA.
  std::string quantize;
  // Only the stages [begin, end) are built (end < 0: all); the others are empty
  // placeholders, so that a part of a model too large for a device never exists whole.
  int begin = 0, end = -1;
  // A width-scaled submodel (section width; ModelSpec::width < 1): ceil(width x kv_heads)
  // key/value heads with their groups of query heads (the head size kept), ceil(width x
  // ffn) MLP features; the projections back into the residual stream (o_proj,
  // down_proj) divide their outputs by sqrt(width) and multiply their gradients by it.
  double width = 1;
  // The float32 weights are read from a folder right after (LoadHfInto): left
  // uninitialised (torch::empty's pages, untouched until read into) rather than drawn.
  bool weights_follow = false;
};

// The decoder `config` shapes, initialised as transformers does (normal, std 0.02; unit
// norms; zero biases) from the current torch seed. Inputs are [batch, T] token ids (any
// dtype: split learning carries them as floats); the output is [batch, T, vocab] logits.
// With LoRA every tensor but the adapters is frozen (the embedding too when tied).
torch::nn::Sequential BuildLlama(const DecoderConfig& config, const LlamaBuild& build);

// A projection's frozen weight held in a codec's encoding (LlamaBuild::quantize); never
// a parameter, so never in the model's ParameterSet.
struct QuantizedWeight {
  std::shared_ptr<Codec> codec;
  std::vector<int64_t> shape;                // [out, in]
  std::shared_ptr<const std::string> owner;  // keeps `bytes` alive
  std::string_view bytes;
  torch::Tensor Dequantize() const;
};

// The quantized weights of the modules under `seq`, named as their float32 weights would
// be ("1.self_attn.q_proj.weight"), in module order.
std::vector<std::pair<std::string, QuantizedWeight*>> QuantizedWeights(const torch::nn::Module& seq);

// The set of `weights` (sharing their bytes), and their replacement by `set`'s:
// INVALID_ARGUMENT (nothing changed) unless `set` is in their codec and has each with its
// shape.
QuantizedSet QuantizedSetOf(const std::vector<std::pair<std::string, QuantizedWeight*>>& weights);
Status LoadQuantizedWeights(const std::vector<std::pair<std::string, QuantizedWeight*>>& weights,
                            const QuantizedSet& set);

// The embedding's weight when `stage` is a head tied to it (named "0.embed_tokens.weight"
// in the whole model, a tensor of stage 0); undefined otherwise.
torch::Tensor TiedHeadWeight(const torch::nn::Module& stage);

// Turns activation checkpointing (train.recompute) of the decoder blocks under `seq` on
// or off. False when there are none.
bool SetRecompute(const torch::nn::Module& seq, bool on);

// Turns the key/value cache of `seq`'s attention on (empty) or off: with it on, each
// forward takes only the tokens that follow those already seen (batch 1 for generation),
// at the positions after them, and attends to the cached keys and values. False when
// `seq` is not a Llama-family decoder.
bool SetKvCache(torch::nn::Sequential& seq, bool on);

}  // namespace cleave
