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

#include "models/hf_config.h"
#include "models/model.h"

namespace cleave {

// The decoder `config` shapes, initialised as transformers does (normal, std 0.02; unit
// norms; zero biases) from the current torch seed. Inputs are [batch, T] token ids (any
// dtype: split learning carries them as floats); the output is [batch, T, vocab] logits.
torch::nn::Sequential BuildLlama(const DecoderConfig& config, const LoraConfig& lora);

// Turns the key/value cache of `seq`'s attention on (empty) or off: with it on, each
// forward takes only the tokens that follow those already seen (batch 1 for generation),
// at the positions after them, and attends to the cached keys and values. False when
// `seq` is not a Llama-family decoder.
bool SetKvCache(torch::nn::Sequential& seq, bool on);

}  // namespace cleave
