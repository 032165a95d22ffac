// Internal to models/ (includes LibTorch): the built-in GPT-style decoder, GPT-2's
// architecture (Radford et al. 2019): token + position embedding, pre-norm blocks of
// causal multi-head self-attention and a GELU MLP with residual connections, a final
// LayerNorm and the language-model head. Its stages are the embedding, each block and
// the head, so split learning can cut it between any two of them.
//
// Tensor names and shapes are GPT-2's (Hugging Face's GPT2LMHeadModel) behind a stage
// prefix: "0.wte.weight" [vocab, dim], "0.wpe.weight" [context, dim]; block i is stage
// i + 1 with "ln_1", "attn.c_attn" (weight [dim, 3 dim]: GPT-2's Conv1D stores
// weights input-major), "attn.c_proj", "ln_2", "mlp.c_fc" [dim, 4 dim], "mlp.c_proj";
// stage layers + 1 holds "ln_f" and, untied, "lm_head.weight" [vocab, dim]. A
// width-scaled submodel (spec.width < 1) keeps ceil(width x heads) heads of the same
// size (c_attn [dim, 3 h head_dim], c_proj [h head_dim, dim]) and ceil(width x 4 dim) MLP
// features; the embedding, norms and head stay whole. Tied, the
// head multiplies by the embedding's wte and holds no tensor of its own. With LoRA
// (spec.lora), each targeted projection also holds "lora_A" [in, rank] and "lora_B"
// [rank, out] ("1.attn.c_attn.lora_A"), and every other tensor is frozen
// (requires_grad false).
#pragma once

#include <torch/torch.h>

#include <cmath>

#include "models/model.h"

namespace cleave {

// The decoder `spec.gpt` sizes, initialised as GPT-2 (normal, std 0.02; the residual
// projections scaled by 1/sqrt(2 layers)) from the current torch seed. Inputs are
// [batch, T] token ids (any dtype: split learning carries them as floats), T <=
// context; the output is [batch, T, vocab] logits.
torch::nn::Sequential BuildGpt(const ModelSpec& spec);

// A width-r submodel's layer whose inputs were cut sums r of the terms the whole model's
// does (fewer channels, heads or MLP features): its output is divided by sqrt(r), in
// training and evaluation, and its parameters' gradients are multiplied by sqrt(r) again,
// so that they step as the whole model's would (models/builtin_models.cc says why not
// HeteroFL's ÷ r). For the decoders' projections back into the residual stream, which
// has no normalization of its own, and the built-in image models' layers. Width 1:
// nothing.
struct WidthScale {
  explicit WidthScale(double width) : factor(std::sqrt(width)) {}
  void Rescale(torch::nn::Module& layer) const {
    if (factor >= 1) return;
    for (auto& p : layer.parameters()) p.register_hook([f = factor](torch::Tensor g) { return g * f; });
  }
  torch::Tensor operator()(const torch::Tensor& y) const { return factor >= 1 ? y : y / factor; }
  double factor;
};

// An untied language-model head's weight, [vocab, dim] as nn.Linear without bias (the
// GPT-style and the Llama-family decoders').
struct LmHeadImpl : torch::nn::Module {
  LmHeadImpl(int64_t vocab, int64_t dim)
      : weight(register_parameter("weight", torch::empty({vocab, dim}))) {}
  torch::Tensor weight;
};
TORCH_MODULE(LmHead);

}  // namespace cleave
