// The Llama-family decoders' shape as a Hugging Face config.json states it: model_type
// llama (1, 2, 3.x), mistral, qwen2 and qwen3 (models/llama.h builds them). Each field
// is named after its config.json key; absent keys take the defaults of transformers'
// configuration class for that model_type. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace cleave {

struct DecoderConfig {
  std::string model_type;       // llama | mistral | qwen2 | qwen3
  int64_t vocab = 0;            // vocab_size
  int64_t dim = 0;              // hidden_size
  int64_t ffn = 0;              // intermediate_size: the SwiGLU MLP's width
  int layers = 0;               // num_hidden_layers
  int heads = 0;                // num_attention_heads
  int kv_heads = 0;             // num_key_value_heads (grouped-query attention; = heads)
  int64_t head_dim = 0;         // head_dim (hidden_size / heads; qwen3: 128)
  int64_t context = 0;          // max_position_embeddings
  double rms_eps = 1e-6;        // rms_norm_eps
  double rope_theta = 10000;    // rope_theta
  // rope_scaling: "" (none) | "linear" (positions / factor) | "llama3" (Llama 3.1's
  // frequency-dependent scaling, with the low/high frequency factors and the original
  // context)
  std::string rope_type;
  double rope_factor = 1;
  double rope_low_freq_factor = 1;
  double rope_high_freq_factor = 4;
  int64_t rope_original_context = 8192;  // original_max_position_embeddings
  bool tie = false;             // tie_word_embeddings
  bool qkv_bias = false;        // q/k/v projections with bias (qwen2; llama's attention_bias)
  bool o_bias = false;          // o_proj with bias (llama's attention_bias)
  bool mlp_bias = false;        // mlp_bias (llama)
  bool qk_norm = false;         // per-head RMSNorm of queries and keys (qwen3)
  int64_t sliding_window = 0;   // mistral: attend to the last N positions; 0 = all
  int64_t bos_token_id = -1;    // -1 = none
  int64_t eos_token_id = -1;
};

// config.json's text → the decoder's shape. INVALID_ARGUMENT naming `what` (the file)
// and the key for an unknown model_type, a missing or mistyped key, an activation other
// than silu, or sizes that do not fit (heads not a multiple of kv_heads, ...).
StatusOr<DecoderConfig> ParseHfConfig(const std::string& json_text, const std::string& what);

// The tensors a Hugging Face folder holds for `c`, under the folder's names
// (model.embed_tokens.weight, model.layers.0.self_attn.q_proj.weight, ..., lm_head.weight
// unless tied), with their shapes: what a folder is checked against before a model of
// its config.json is built.
struct HfTensorShape {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<HfTensorShape> HfTensorShapes(const DecoderConfig& c);
// The decoder's weights as float32, in bytes: what building it allocates (once for the
// model, and again for each copy of its parameters).
int64_t HfModelBytes(const DecoderConfig& c);

// The config.json that ParseHfConfig reads back as `c` (for `cleave export`).
std::string HfConfigJson(const DecoderConfig& c);

}  // namespace cleave
