#include "models/llama.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/gpt.h"

namespace cleave {
namespace {

namespace nn = torch::nn;

// A frozen weight held quantized (model.quantize) is used through this: the forward pass
// dequantizes it for the product and the backward pass again for the input's gradient,
// so autograd keeps no float32 copy (QLoRA's scheme; the weight itself gets no
// gradient).
struct DequantizedMatmul : torch::autograd::Function<DequantizedMatmul> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const QuantizedWeight* w) {
    ctx->saved_data["w"] = reinterpret_cast<int64_t>(w);
    return torch::linear(x, w->Dequantize());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const auto* w = reinterpret_cast<const QuantizedWeight*>(ctx->saved_data["w"].toInt());
    return {torch::matmul(grad[0], w->Dequantize()), torch::Tensor()};
  }
};

// nn.Linear's layout (weight [out, in]), with a bias or not, the weight float32 or held
// quantized (`quant`); with a LoRA adapter (PEFT's layout: lora_A [rank, in], lora_B
// [out, rank]) it adds scale * B A dropout(x).
struct ProjectionImpl : nn::Module {
  ProjectionImpl(int64_t in, int64_t out, bool bias, const std::shared_ptr<Codec>& codec)
      : in(in), out(out) {
    if (codec != nullptr) {
      quant = std::make_shared<QuantizedWeight>();
      quant->codec = codec;
      quant->shape = {out, in};
    } else {
      weight = register_parameter("weight", torch::empty({out, in}));
    }
    if (bias) this->bias = register_parameter("bias", torch::zeros({out}));
  }
  void AddLora(int64_t rank, double scale_, double dropout_) {
    lora_a = register_parameter("lora_A", torch::empty({rank, in}));
    lora_b = register_parameter("lora_B", torch::zeros({out, rank}));
    scale = scale_;
    dropout = dropout_;
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y;
    if (quant) {
      y = DequantizedMatmul::apply(x, quant.get());
      if (bias.defined()) y = y + bias;
    } else {
      y = torch::linear(x, weight, bias);
    }
    if (lora_a.defined()) {
      auto in = dropout > 0 ? torch::dropout(x, dropout, is_training()) : x;
      y = y + torch::linear(torch::linear(in, lora_a), lora_b).mul_(scale);
    }
    return y;
  }
  int64_t in, out;
  torch::Tensor weight, bias;  // weight undefined when quantized
  std::shared_ptr<QuantizedWeight> quant;
  torch::Tensor lora_a, lora_b;  // undefined without an adapter
  double scale = 0, dropout = 0;
};
TORCH_MODULE(Projection);

// RMSNorm as transformers computes it: in float32, x / sqrt(mean(x^2) + eps), times the
// gain.
struct RmsNormImpl : nn::Module {
  RmsNormImpl(int64_t dim, double eps) : weight(register_parameter("weight", torch::ones({dim}))), eps(eps) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
  }
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RmsNorm);

struct EmbeddingImpl : nn::Module {
  EmbeddingImpl(int64_t vocab, int64_t dim, int64_t context)
      : embed_tokens(register_module("embed_tokens", nn::Embedding(vocab, dim))), context(context) {}
  torch::Tensor forward(const torch::Tensor& x) {
    TORCH_CHECK(x.size(1) <= context, "a sequence of ", x.size(1),
                " tokens is longer than the context (", context, ")");
    auto ids = x.to(torch::kInt64);
    const int64_t vocab = embed_tokens->weight.size(0);
    TORCH_CHECK(ids.min().item<int64_t>() >= 0 && ids.max().item<int64_t>() < vocab,
                "token ids must be in [0, ", vocab, ")");
    return embed_tokens(ids);
  }
  nn::Embedding embed_tokens;
  int64_t context;
};
TORCH_MODULE(Embedding);

// The rotary embedding's inverse frequencies (transformers' rope_init_fn for the
// default, linear and llama3 types), in float64.
torch::Tensor InverseFrequencies(const DecoderConfig& c) {
  const int64_t hd = c.head_dim;
  auto inv = 1.0 / torch::pow(c.rope_theta, torch::arange(0, hd, 2, torch::kFloat64) / double(hd));
  if (c.rope_type == "linear") return inv / c.rope_factor;
  if (c.rope_type != "llama3") return inv;
  const double low_wavelen = c.rope_original_context / c.rope_low_freq_factor;
  const double high_wavelen = c.rope_original_context / c.rope_high_freq_factor;
  auto wavelen = 2 * M_PI / inv;
  auto scaled = torch::where(wavelen > low_wavelen, inv / c.rope_factor, inv);
  auto smooth = (c.rope_original_context / wavelen - c.rope_low_freq_factor) /
                (c.rope_high_freq_factor - c.rope_low_freq_factor);
  auto smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
  auto medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
  return torch::where(medium, smoothed, scaled);
}

// x rotated by its positions: x cos + rotate_half(x) sin, where rotate_half(x) =
// [-x2, x1] for x's halves x1, x2 (transformers' apply_rotary_pos_emb).
torch::Tensor Rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

struct SelfAttentionImpl : nn::Module {
  SelfAttentionImpl(const DecoderConfig& c, const std::shared_ptr<Codec>& q, double width)
      : heads(c.heads), kv_heads(c.kv_heads), hd(c.head_dim), window(c.sliding_window),
        inv_freq(InverseFrequencies(c)),
        q_proj(register_module("q_proj", Projection(c.dim, c.heads * c.head_dim, c.qkv_bias, q))),
        k_proj(register_module("k_proj", Projection(c.dim, c.kv_heads * c.head_dim, c.qkv_bias, q))),
        v_proj(register_module("v_proj", Projection(c.dim, c.kv_heads * c.head_dim, c.qkv_bias, q))),
        o_proj(register_module("o_proj", Projection(c.heads * c.head_dim, c.dim, c.o_bias, q))),
        scale(width) {
    scale.Rescale(*o_proj);
    if (c.qk_norm) {
      q_norm = register_module("q_norm", RmsNorm(c.head_dim, c.rms_eps));
      k_norm = register_module("k_norm", RmsNorm(c.head_dim, c.rms_eps));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), rep = heads / kv_heads;
    const int64_t past = caching && k_cache.defined() ? k_cache.size(2) : 0;
    auto q = q_proj(x).view({b, t, heads, hd});
    auto k = k_proj(x).view({b, t, kv_heads, hd});
    auto v = v_proj(x).view({b, t, kv_heads, hd}).transpose(1, 2);
    if (q_norm) {
      q = q_norm(q);
      k = k_norm(k);
    }
    Positions(past, t);
    q = Rotate(q.transpose(1, 2), cos, sin);  // b h t hd
    k = Rotate(k.transpose(1, 2), cos, sin);  // b kv t hd
    if (caching) {
      if (past > 0) {
        k = torch::cat({k_cache, k}, 2);
        v = torch::cat({v_cache, v}, 2);
      }
      k_cache = k;
      v_cache = v;
    }
    const int64_t total = past + t;
    // Grouped-query attention: query head g * rep + r reads key/value head g (transformers'
    // repeat_kv), without copying the keys and values.
    auto qg = q.reshape({b, kv_heads, rep * t, hd});
    auto att = torch::matmul(qg, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(double(hd)));
    att = torch::softmax(att.view({b, kv_heads, rep, t, total}) + mask, -1);
    auto y = torch::matmul(att.view({b, kv_heads, rep * t, total}), v);  // b kv rep*t hd
    y = y.view({b, heads, t, hd}).transpose(1, 2).reshape({b, t, heads * hd});
    return scale(o_proj(y));
  }

  // The cos / sin tables of positions [past, past + t) and the mask of those t queries
  // over the past + t keys.
  void Positions(int64_t past, int64_t t) {
    if (cos.defined() && cos.size(0) == t && positions_from == past) return;
    positions_from = past;
    auto freqs = torch::outer(torch::arange(past, past + t, torch::kFloat64), inv_freq);
    auto emb = torch::cat({freqs, freqs}, -1);
    cos = emb.cos().to(torch::kFloat32);
    sin = emb.sin().to(torch::kFloat32);
    auto i = torch::arange(past, past + t).unsqueeze(1), j = torch::arange(past + t).unsqueeze(0);
    auto allowed = j <= i;
    if (window > 0) allowed = allowed.logical_and(i - j < window);
    mask = torch::zeros({t, past + t}).masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
  }

  int64_t heads, kv_heads, hd, window;
  torch::Tensor inv_freq;  // not buffers: they are not part of the model's state
  torch::Tensor cos, sin, mask;
  int64_t positions_from = 0;
  // The key/value cache (SetKvCache): keys and values of the tokens seen so far.
  bool caching = false;
  torch::Tensor k_cache, v_cache;
  Projection q_proj, k_proj, v_proj, o_proj;
  WidthScale scale;
  RmsNorm q_norm{nullptr}, k_norm{nullptr};
};
TORCH_MODULE(SelfAttention);

struct SwiGluImpl : nn::Module {
  SwiGluImpl(const DecoderConfig& c, const std::shared_ptr<Codec>& q, double width)
      : gate_proj(register_module("gate_proj", Projection(c.dim, c.ffn, c.mlp_bias, q))),
        up_proj(register_module("up_proj", Projection(c.dim, c.ffn, c.mlp_bias, q))),
        down_proj(register_module("down_proj", Projection(c.ffn, c.dim, c.mlp_bias, q))),
        scale(width) {
    scale.Rescale(*down_proj);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return scale(down_proj(torch::silu(gate_proj(x)) * up_proj(x)));
  }
  Projection gate_proj, up_proj, down_proj;
  WidthScale scale;
};
TORCH_MODULE(SwiGlu);

struct DecoderBlockImpl : nn::Module {
  DecoderBlockImpl(const DecoderConfig& c, const std::shared_ptr<Codec>& q, double width)
      : input_layernorm(register_module("input_layernorm", RmsNorm(c.dim, c.rms_eps))),
        self_attn(register_module("self_attn", SelfAttention(c, q, width))),
        post_attention_layernorm(register_module("post_attention_layernorm", RmsNorm(c.dim, c.rms_eps))),
        mlp(register_module("mlp", SwiGlu(c, q, width))) {}
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor Run(torch::Tensor x) {
    x = x + self_attn(input_layernorm(x));
    return x + mlp(post_attention_layernorm(x));
  }
  RmsNorm input_layernorm;
  SelfAttention self_attn;
  RmsNorm post_attention_layernorm;
  SwiGlu mlp;
  bool recompute = false;  // SetRecompute
};
TORCH_MODULE(DecoderBlock);

// Activation checkpointing (train.recompute): the block's forward pass runs without a
// graph and keeps only its input; the backward pass runs it again with one, under the
// random state the first pass had (the same dropout masks), and back-propagates through
// it. torch.utils.checkpoint's reentrant scheme.
struct Recomputed : torch::autograd::Function<Recomputed> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               DecoderBlockImpl* block) {
    ctx->saved_data["block"] = reinterpret_cast<int64_t>(block);
    auto gen = at::detail::getDefaultCPUGenerator();
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["rng"] = gen.get_state();
    }
    ctx->save_for_backward({x});
    return block->Run(x);  // autograd is off inside a Function's forward
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto* block = reinterpret_cast<DecoderBlockImpl*>(ctx->saved_data["block"].toInt());
    auto x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    auto gen = at::detail::getDefaultCPUGenerator();
    torch::Tensor now;
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      now = gen.get_state();
      gen.set_state(ctx->saved_data["rng"].toTensor());
    }
    torch::Tensor y;
    {
      torch::AutoGradMode on(true);
      y = block->Run(x);
    }
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(now);
    }
    torch::autograd::backward({y}, {grad[0]});
    return {x.grad(), torch::Tensor()};
  }
};

torch::Tensor DecoderBlockImpl::forward(const torch::Tensor& x) {
  if (!(recompute && is_training() && torch::GradMode::is_enabled())) return Run(x);
  // The output needs a graph to the adapters inside even when the input has none (a
  // frozen embedding's): the function then stands for the block with an input that does.
  return Recomputed::apply(x.requires_grad() ? x : x.detach().requires_grad_(true), this);
}

struct DecoderHeadImpl : nn::Module {
  // `tied`: the embedding's weight, used as the head's and not registered here.
  DecoderHeadImpl(const DecoderConfig& c, torch::Tensor tied)
      : norm(register_module("norm", RmsNorm(c.dim, c.rms_eps))) {
    weight = tied.defined() ? tied : register_module("lm_head", LmHead(c.vocab, c.dim))->weight;
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::linear(norm(x), weight); }
  RmsNorm norm;
  torch::Tensor weight;
};
TORCH_MODULE(DecoderHead);

}  // namespace

bool SetRecompute(const nn::Module& seq, bool on) {
  bool found = false;
  for (const auto& m : seq.modules(/*include_self=*/true)) {
    if (auto* block = m->as<DecoderBlockImpl>()) {
      block->recompute = on;
      found = true;
    }
  }
  return found;
}

bool SetKvCache(nn::Sequential& seq, bool on) {
  bool found = false;
  for (const auto& m : seq->modules(/*include_self=*/false)) {
    if (auto* attention = m->as<SelfAttentionImpl>()) {
      attention->caching = on;
      attention->k_cache = torch::Tensor();
      attention->v_cache = torch::Tensor();
      found = true;
    }
  }
  return found;
}

nn::Sequential BuildLlama(const DecoderConfig& whole, const LlamaBuild& o) {
  const LoraConfig& lora = o.lora;
  DecoderConfig c = whole;
  if (o.width < 1) {  // the submodel's heads (whole groups of query heads) and features
    const auto share = [&](int64_t n) {
      return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(o.width * static_cast<double>(n) - 1e-9)));
    };
    const int group = whole.heads / whole.kv_heads;
    c.kv_heads = static_cast<int>(share(whole.kv_heads));
    c.heads = c.kv_heads * group;
    c.ffn = share(whole.ffn);
  }
  std::shared_ptr<Codec> codec;
  if (!o.quantize.empty()) {
    auto made = MakeStatelessCodec(o.quantize, 0);
    TORCH_CHECK(made.ok() && *made != nullptr, "model.quantize: ", std::string(made.status().message()));
    codec = std::shared_ptr<Codec>(std::move(*made));
  }
  const int stages = c.layers + 2, end = o.end < 0 ? stages : o.end;
  auto kept = [&](int stage) { return stage >= o.begin && stage < end; };
  // The head tied to the embedding needs its weight even where stage 0 is not kept.
  const bool need_embed = kept(0) || (c.tie && kept(stages - 1));
  nn::Sequential seq;
  Embedding embed{nullptr};
  if (need_embed) embed = Embedding(c.vocab, c.dim, c.context);
  seq->push_back(kept(0) ? nn::AnyModule(embed) : nn::AnyModule(nn::Identity()));
  std::vector<DecoderBlock> blocks;
  for (int i = 0; i < c.layers; ++i) {
    if (kept(i + 1)) {
      blocks.push_back(DecoderBlock(c, codec, o.width));
      seq->push_back(blocks.back());
    } else {
      seq->push_back(nn::Identity());
    }
  }
  if (kept(stages - 1)) {
    seq->push_back(DecoderHead(c, c.tie ? embed->embed_tokens->weight : torch::Tensor()));
  } else {
    seq->push_back(nn::Identity());
  }
  // transformers' _init_weights: N(0, 0.02) for projections and embeddings, zero biases,
  // unit norms (already ones). A quantized weight is drawn, then quantized.
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> params;
  if (need_embed && !kept(0)) params.emplace_back("embed_tokens.weight", embed->embed_tokens->weight);
  for (auto& p : seq->named_parameters(/*recurse=*/true)) params.emplace_back(p.key(), p.value());
  for (auto& [name, value] : params) {
    if (o.weights_follow || name.find("norm.weight") != std::string::npos) continue;
    if (value.dim() == 1) {
      value.zero_();
    } else {
      value.normal_(0, 0.02);
    }
  }
  for (auto& [name, w] : QuantizedWeights(*seq)) {
    auto values = torch::empty(w->shape).normal_(0, 0.02);
    QuantizedTensor q = QuantizeTensor(*codec, name, w->shape, values.data_ptr<float>());
    w->owner = std::move(q.owner);
    w->bytes = q.bytes;
  }
  if (lora.enabled()) {
    for (auto& block : blocks) {
      const std::pair<const char*, Projection> targets[] = {
          {"q_proj", block->self_attn->q_proj},     {"k_proj", block->self_attn->k_proj},
          {"v_proj", block->self_attn->v_proj},     {"o_proj", block->self_attn->o_proj},
          {"gate_proj", block->mlp->gate_proj},     {"up_proj", block->mlp->up_proj},
          {"down_proj", block->mlp->down_proj}};
      for (auto [name, proj] : targets) {
        if (!lora.Targets(name)) continue;
        proj->AddLora(lora.rank, lora.alpha / lora.rank, lora.dropout);
        const double bound = 1.0 / std::sqrt(static_cast<double>(proj->in));
        proj->lora_a.uniform_(-bound, bound);
      }
    }
    for (auto& p : seq->named_parameters(/*recurse=*/true)) {
      if (p.key().find(".lora_") == std::string::npos) p.value().requires_grad_(false);
    }
    if (need_embed) embed->embed_tokens->weight.requires_grad_(false);
  }
  return seq;
}

torch::Tensor QuantizedWeight::Dequantize() const {
  auto w = torch::empty(shape);
  codec->DecodeRange(bytes, shape, 0, w.numel(), w.data_ptr<float>());
  return w;
}

std::vector<std::pair<std::string, QuantizedWeight*>> QuantizedWeights(const nn::Module& seq) {
  std::vector<std::pair<std::string, QuantizedWeight*>> out;
  for (const auto& m : seq.named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (auto* p = m.value()->as<ProjectionImpl>(); p != nullptr && p->quant) {
      out.emplace_back(m.key() + ".weight", p->quant.get());
    }
  }
  return out;
}

QuantizedSet QuantizedSetOf(const std::vector<std::pair<std::string, QuantizedWeight*>>& weights) {
  QuantizedSet set;
  for (const auto& [name, w] : weights) {
    set.spec = w->codec->name();
    set.tensors.push_back({name, w->shape, w->bytes, w->owner});
  }
  return set;
}

Status LoadQuantizedWeights(const std::vector<std::pair<std::string, QuantizedWeight*>>& weights,
                            const QuantizedSet& set) {
  for (const auto& [name, w] : weights) {
    if (set.spec != w->codec->name()) {
      return absl::InvalidArgumentError(absl::StrCat("a quantized base in codec '", set.spec,
                                                     "' for a model quantized in ", w->codec->name()));
    }
    const QuantizedTensor* t = set.Find(name);
    if (t == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("the quantized base has no tensor ", name));
    }
    if (t->shape != w->shape) {
      return absl::InvalidArgumentError(absl::StrCat("quantized tensor ", name, " is shaped [",
                                                     absl::StrJoin(t->shape, ", "), "], expected [",
                                                     absl::StrJoin(w->shape, ", "), "]"));
    }
  }
  for (const auto& [name, w] : weights) {
    const QuantizedTensor* t = set.Find(name);
    w->owner = t->owner;
    w->bytes = t->bytes;
  }
  return absl::OkStatus();
}

torch::Tensor TiedHeadWeight(const nn::Module& stage) {
  const auto* head = stage.as<DecoderHeadImpl>();
  if (head == nullptr || head->named_parameters().contains("lm_head.weight")) return {};
  return head->weight;
}

}  // namespace cleave
