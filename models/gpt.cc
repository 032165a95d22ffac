#include "models/gpt.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace cleave {
namespace {

namespace nn = torch::nn;

// GPT-2's Conv1D: a linear layer whose weight is [in, out]; with a LoRA adapter,
// x W + b + scale (dropout(x) A) B with A [in, rank] and B [rank, out].
struct Conv1DImpl : nn::Module {
  Conv1DImpl(int64_t in, int64_t out)
      : weight(register_parameter("weight", torch::empty({in, out}))),
        bias(register_parameter("bias", torch::zeros({out}))) {}
  void AddLora(int64_t rank, double scale_, double dropout_) {
    lora_a = register_parameter("lora_A", torch::empty({weight.size(0), rank}));
    lora_b = register_parameter("lora_B", torch::zeros({rank, weight.size(1)}));
    scale = scale_;
    dropout = dropout_;
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto flat_x = x.reshape({-1, weight.size(0)});
    auto flat = torch::addmm(bias, flat_x, weight);
    if (lora_a.defined()) {
      auto in = dropout > 0 ? torch::dropout(flat_x, dropout, is_training()) : flat_x;
      flat = flat + torch::matmul(torch::matmul(in, lora_a), lora_b).mul_(scale);
    }
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(1);
    return flat.view(sizes);
  }
  torch::Tensor weight, bias;
  torch::Tensor lora_a, lora_b;  // undefined without an adapter
  double scale = 0, dropout = 0;
};
TORCH_MODULE(Conv1D);

struct GptEmbeddingImpl : nn::Module {
  GptEmbeddingImpl(int64_t vocab, int64_t context, int64_t dim)
      : wte(register_module("wte", nn::Embedding(vocab, dim))),
        wpe(register_module("wpe", nn::Embedding(context, dim))) {}
  torch::Tensor forward(torch::Tensor x) {
    const int64_t t = x.size(1);
    TORCH_CHECK(t <= wpe->weight.size(0), "a sequence of ", t, " tokens is longer than the context (",
                wpe->weight.size(0), ")");
    auto ids = x.to(torch::kInt64);
    const int64_t vocab = wte->weight.size(0);
    TORCH_CHECK(ids.min().item<int64_t>() >= 0 && ids.max().item<int64_t>() < vocab,
                "token ids must be in [0, ", vocab, ")");
    return wte(ids) + wpe(torch::arange(t, torch::kInt64));
  }
  nn::Embedding wte, wpe;
};
TORCH_MODULE(GptEmbedding);

// `heads` heads of `head_dim` each (a width-r submodel keeps ceil(r H) of the whole
// model's H, each of the same size).
struct AttentionImpl : nn::Module {
  AttentionImpl(int64_t dim, int64_t heads, int64_t head_dim, double width)
      : heads(heads),
        head_dim(head_dim),
        c_attn(register_module("c_attn", Conv1D(dim, 3 * heads * head_dim))),
        c_proj(register_module("c_proj", Conv1D(heads * head_dim, dim))),
        scale(width) {
    scale.Rescale(*c_proj);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), hd = head_dim;
    auto qkv = c_attn(x).view({b, t, 3, heads, hd}).permute({2, 0, 3, 1, 4});  // 3 b h t hd
    auto q = qkv[0], k = qkv[1], v = qkv[2];
    auto att = torch::matmul(q, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(double(hd)));
    att = torch::softmax(att + CausalMask(t), -1);
    auto y = torch::matmul(att, v).transpose(1, 2).reshape({b, t, heads * hd});
    return scale(c_proj(y));
  }
  // 0 on and below the diagonal, -inf above: position i attends to positions <= i.
  const torch::Tensor& CausalMask(int64_t t) {
    if (!mask.defined() || mask.size(0) != t) {
      mask = torch::full({t, t}, -std::numeric_limits<float>::infinity()).triu(1);
    }
    return mask;
  }
  int64_t heads, head_dim;
  Conv1D c_attn, c_proj;
  WidthScale scale;
  torch::Tensor mask;  // not a buffer: it is not part of the model's state
};
TORCH_MODULE(Attention);

// `hidden` features (4 dim in the whole model).
struct MlpImpl : nn::Module {
  MlpImpl(int64_t dim, int64_t hidden, double width)
      : c_fc(register_module("c_fc", Conv1D(dim, hidden))),
        c_proj(register_module("c_proj", Conv1D(hidden, dim))),
        scale(width) {
    scale.Rescale(*c_proj);
  }
  torch::Tensor forward(const torch::Tensor& x) { return scale(c_proj(torch::gelu(c_fc(x), "tanh"))); }
  Conv1D c_fc, c_proj;
  WidthScale scale;
};
TORCH_MODULE(Mlp);

nn::LayerNormOptions Norm(int64_t dim) { return nn::LayerNormOptions({dim}).eps(1e-5); }

// The leading ceil(width x n) of n (at least 1): a width-scaled submodel's share.
int64_t Share(double width, int64_t n) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(width * static_cast<double>(n) - 1e-9)));
}

// A block of the whole model (width 1), or of a width-scaled submodel: ceil(width x H)
// heads of the whole model's head size, ceil(width x 4 dim) MLP features; the residual
// stream keeps its width.
struct BlockImpl : nn::Module {
  BlockImpl(int64_t dim, int64_t heads, double width)
      : ln_1(register_module("ln_1", nn::LayerNorm(Norm(dim)))),
        attn(register_module("attn", Attention(dim, Share(width, heads), dim / heads, width))),
        ln_2(register_module("ln_2", nn::LayerNorm(Norm(dim)))),
        mlp(register_module("mlp", Mlp(dim, Share(width, 4 * dim), width))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln_1(x));
    return x + mlp(ln_2(x));
  }
  nn::LayerNorm ln_1;
  Attention attn;
  nn::LayerNorm ln_2;
  Mlp mlp;
};
TORCH_MODULE(Block);

struct HeadImpl : nn::Module {
  // `tied`: the embedding's wte weight, used as the head's and not registered here.
  HeadImpl(int64_t vocab, int64_t dim, torch::Tensor tied)
      : ln_f(register_module("ln_f", nn::LayerNorm(Norm(dim)))) {
    weight = tied.defined() ? tied : register_module("lm_head", LmHead(vocab, dim))->weight;
  }
  torch::Tensor forward(torch::Tensor x) { return torch::matmul(ln_f(x), weight.t()); }
  nn::LayerNorm ln_f;
  torch::Tensor weight;
};
TORCH_MODULE(Head);

}  // namespace

nn::Sequential BuildGpt(const ModelSpec& spec) {
  const GptConfig& g = spec.gpt;
  nn::Sequential seq;
  GptEmbedding embed(g.vocab, g.context, g.dim);
  seq->push_back(embed);
  std::vector<Block> blocks;
  for (int i = 0; i < g.layers; ++i) {
    blocks.push_back(Block(g.dim, g.heads, spec.width));
    seq->push_back(blocks.back());
  }
  seq->push_back(Head(g.vocab, g.dim, g.tie ? embed->wte->weight : torch::Tensor()));
  // GPT-2's initialisation, in model order: N(0, 0.02) weights, zero biases, unit
  // LayerNorm gains; the projections into the residual stream N(0, 0.02 / sqrt(2 L)).
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * g.layers);
  for (auto& p : seq->named_parameters(/*recurse=*/true)) {
    const std::string& name = p.key();
    const bool norm = name.find(".ln_") != std::string::npos;
    if (name.find(".lora_") != std::string::npos) continue;  // none yet; see below
    if (norm) {
      name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0 ? p.value().zero_()
                                                                        : p.value().fill_(1);
    } else if (p.value().dim() == 1) {
      p.value().zero_();
    } else {
      const bool residual = name.find("c_proj.weight") != std::string::npos;
      p.value().normal_(0, residual ? residual_std : 0.02);
    }
  }
  // LoRA after the base, so that the base is initialised the same with or without
  // adapters: A as nn.Linear's default (PEFT's kaiming_uniform, a = sqrt(5): uniform
  // within 1 / sqrt(in)), B zero, so the adapted model starts as the base. Every other
  // tensor is frozen.
  const LoraConfig& lora = spec.lora;
  if (lora.enabled()) {
    for (auto& block : blocks) {
      const std::pair<const char*, Conv1D> targets[] = {{"attn.c_attn", block->attn->c_attn},
                                                          {"attn.c_proj", block->attn->c_proj},
                                                          {"mlp.c_fc", block->mlp->c_fc},
                                                          {"mlp.c_proj", block->mlp->c_proj}};
      for (auto [name, conv] : targets) {
        if (!lora.Targets(name)) continue;
        conv->AddLora(lora.rank, lora.alpha / lora.rank, lora.dropout);
        const double bound = 1.0 / std::sqrt(static_cast<double>(conv->weight.size(0)));
        conv->lora_a.uniform_(-bound, bound);
      }
    }
    for (auto& p : seq->named_parameters(/*recurse=*/true)) {
      if (p.key().find(".lora_") == std::string::npos) p.value().requires_grad_(false);
    }
  }
  return seq;
}

}  // namespace cleave
