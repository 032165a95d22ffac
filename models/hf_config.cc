#include "models/hf_config.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "core/json.h"

namespace cleave {
namespace {

using Json = nlohmann::json;

// Reads config.json's keys with the type each must have, naming the file and the key.
class Keys {
 public:
  Keys(const Json& j, std::string what) : j_(j), what_(std::move(what)) {}

  Status Int(const char* key, int64_t& out) {
    if (!Present(key)) return absl::OkStatus();
    const Json& v = j_[key];
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX})) {
      return Bad(key, "an integer of 64 bits");
    }
    out = v.get<int64_t>();
    return absl::OkStatus();
  }
  Status Int(const char* key, int& out) {
    int64_t v = out;
    RETURN_IF_ERROR(Int(key, v));
    // Not cast: 2^32 + 4 must not become 4.
    if (v < INT_MIN || v > INT_MAX) return Bad(key, "an integer of 32 bits");
    out = static_cast<int>(v);
    return absl::OkStatus();
  }
  Status Number(const char* key, double& out) {
    if (!Present(key)) return absl::OkStatus();
    if (!j_[key].is_number()) return Bad(key, "a number");
    out = j_[key].get<double>();
    return absl::OkStatus();
  }
  Status Bool(const char* key, bool& out) {
    if (!Present(key)) return absl::OkStatus();
    if (!j_[key].is_boolean()) return Bad(key, "true or false");
    out = j_[key].get<bool>();
    return absl::OkStatus();
  }
  // A token id, or a list of them (the first is taken: Llama 3's several end tokens).
  Status TokenId(const char* key, int64_t& out) {
    if (!Present(key)) return absl::OkStatus();
    const Json& v = j_[key];
    if (v.is_array() && !v.empty() && v[0].is_number_integer()) {
      out = v[0].get<int64_t>();
    } else if (v.is_number_integer()) {
      out = v.get<int64_t>();
    } else {
      return Bad(key, "a token id or a list of them");
    }
    return absl::OkStatus();
  }
  bool Present(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  Status Bad(const std::string& key, const std::string& rule) const {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": ", key, " must be ", rule));
  }

 private:
  const Json& j_;
  std::string what_;
};

Status ReadRopeScaling(const Json& j, const std::string& what, DecoderConfig& c) {
  if (!j.contains("rope_scaling") || j["rope_scaling"].is_null()) return absl::OkStatus();
  const Json& r = j["rope_scaling"];
  auto bad = [&](const std::string& m) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rope_scaling ", m));
  };
  if (!r.is_object()) return bad("must be an object");
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (r.contains(key) && r[key].is_string()) type = r[key].get<std::string>();
  }
  if (type == "default") return absl::OkStatus();
  if (type != "linear" && type != "llama3") {
    return bad(absl::StrCat("type '", type, "' is not supported (linear, llama3 or default)"));
  }
  c.rope_type = type;
  Keys k(r, what + ": rope_scaling");
  RETURN_IF_ERROR(k.Number("factor", c.rope_factor));
  if (!(c.rope_factor > 0)) return bad("factor must be > 0");
  if (type == "llama3") {
    RETURN_IF_ERROR(k.Number("low_freq_factor", c.rope_low_freq_factor));
    RETURN_IF_ERROR(k.Number("high_freq_factor", c.rope_high_freq_factor));
    RETURN_IF_ERROR(k.Int("original_max_position_embeddings", c.rope_original_context));
    if (!(c.rope_high_freq_factor > c.rope_low_freq_factor) || c.rope_low_freq_factor <= 0 ||
        c.rope_original_context <= 0) {
      return bad("needs high_freq_factor > low_freq_factor > 0 and original_max_position_embeddings > 0");
    }
  }
  return absl::OkStatus();
}

// transformers' defaults for the keys a config.json may leave out.
void Defaults(DecoderConfig& c) {
  const std::string& t = c.model_type;
  c.vocab = t == "qwen2" || t == "qwen3" ? 151936 : 32000;
  c.dim = 4096;
  c.ffn = t == "mistral" ? 14336 : t == "llama" ? 11008 : 22016;
  c.layers = 32;
  c.heads = 32;
  c.context = t == "llama" ? 2048 : t == "mistral" ? 4096 * 32 : 32768;
  c.qkv_bias = t == "qwen2";
  c.qk_norm = t == "qwen3";
  c.sliding_window = t == "mistral" ? 4096 : 0;
  if (t == "llama" || t == "mistral") {
    c.bos_token_id = 1;
    c.eos_token_id = 2;
  }
}

Status CheckShape(const DecoderConfig& c, const std::string& what) {
  auto bad = [&](const std::string& key, const std::string& rule) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", key, " must be ", rule));
  };
  if (c.vocab < 2 || c.vocab > (int64_t{1} << 24)) return bad("vocab_size", "in [2, 16777216]");
  if (c.dim < 1 || c.dim > 65536) return bad("hidden_size", "in [1, 65536]");
  if (c.ffn < 1 || c.ffn > 262144) return bad("intermediate_size", "in [1, 262144]");
  if (c.layers < 1 || c.layers > 512) return bad("num_hidden_layers", "in [1, 512]");
  if (c.heads < 1 || c.heads > 1024) return bad("num_attention_heads", "in [1, 1024]");
  if (c.kv_heads < 1 || c.heads % c.kv_heads != 0) {
    return bad("num_key_value_heads", ">= 1 and divide num_attention_heads");
  }
  if (c.head_dim < 2 || c.head_dim % 2 != 0 || c.head_dim > 4096) {
    return bad("head_dim", "even and in [2, 4096] (hidden_size / num_attention_heads by default)");
  }
  if (c.context < 1) return bad("max_position_embeddings", ">= 1");
  if (!(c.rms_eps > 0)) return bad("rms_norm_eps", "> 0");
  if (!(c.rope_theta > 0)) return bad("rope_theta", "> 0");
  if (c.sliding_window < 0) return bad("sliding_window", ">= 0 or null");
  return absl::OkStatus();
}

}  // namespace

StatusOr<DecoderConfig> ParseHfConfig(const std::string& json_text, const std::string& what) {
  ASSIGN_OR_RETURN(const Json j, ParseJsonObject(json_text, what));
  DecoderConfig c;
  if (!j.contains("model_type") || !j["model_type"].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": model_type is missing"));
  }
  c.model_type = j["model_type"].get<std::string>();
  if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2" &&
      c.model_type != "qwen3") {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": model_type '", c.model_type, "' is not supported (llama, mistral, qwen2, qwen3)"));
  }
  Defaults(c);
  Keys k(j, what);
  if (k.Present("hidden_act") &&
      (!j["hidden_act"].is_string() || j["hidden_act"].get<std::string>() != "silu")) {
    return k.Bad("hidden_act", "silu (the SwiGLU MLP of these models)");
  }
  RETURN_IF_ERROR(k.Int("vocab_size", c.vocab));
  RETURN_IF_ERROR(k.Int("hidden_size", c.dim));
  RETURN_IF_ERROR(k.Int("intermediate_size", c.ffn));
  RETURN_IF_ERROR(k.Int("num_hidden_layers", c.layers));
  RETURN_IF_ERROR(k.Int("num_attention_heads", c.heads));
  c.kv_heads = c.heads;
  RETURN_IF_ERROR(k.Int("num_key_value_heads", c.kv_heads));
  c.head_dim = c.model_type == "qwen3" ? 128 : (c.heads > 0 ? c.dim / c.heads : 0);
  RETURN_IF_ERROR(k.Int("head_dim", c.head_dim));
  RETURN_IF_ERROR(k.Int("max_position_embeddings", c.context));
  RETURN_IF_ERROR(k.Number("rms_norm_eps", c.rms_eps));
  RETURN_IF_ERROR(k.Number("rope_theta", c.rope_theta));
  RETURN_IF_ERROR(ReadRopeScaling(j, what, c));
  RETURN_IF_ERROR(k.Bool("tie_word_embeddings", c.tie));
  if (c.model_type == "llama" || c.model_type == "qwen3") {
    bool attention_bias = false;
    RETURN_IF_ERROR(k.Bool("attention_bias", attention_bias));
    c.qkv_bias = attention_bias;
    c.o_bias = attention_bias;
  }
  if (c.model_type == "llama") RETURN_IF_ERROR(k.Bool("mlp_bias", c.mlp_bias));
  if (c.model_type == "mistral") {
    if (k.Present("sliding_window")) {
      RETURN_IF_ERROR(k.Int("sliding_window", c.sliding_window));
    } else if (j.contains("sliding_window")) {
      c.sliding_window = 0;  // null: attend to every position
    }
  }
  if (c.model_type == "qwen2" || c.model_type == "qwen3") {
    bool sliding = false;
    RETURN_IF_ERROR(k.Bool("use_sliding_window", sliding));
    if (sliding) return k.Bad("use_sliding_window", "false (sliding-window layers are not supported)");
  }
  RETURN_IF_ERROR(k.TokenId("bos_token_id", c.bos_token_id));
  RETURN_IF_ERROR(k.TokenId("eos_token_id", c.eos_token_id));
  RETURN_IF_ERROR(CheckShape(c, what));
  return c;
}

std::vector<HfTensorShape> HfTensorShapes(const DecoderConfig& c) {
  std::vector<HfTensorShape> out;
  const int64_t q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  out.push_back({"model.embed_tokens.weight", {c.vocab, c.dim}});
  for (int i = 0; i < c.layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    auto add = [&](const std::string& name, std::vector<int64_t> shape) { out.push_back({p + name, std::move(shape)}); };
    add("input_layernorm.weight", {c.dim});
    add("self_attn.q_proj.weight", {q, c.dim});
    add("self_attn.k_proj.weight", {kv, c.dim});
    add("self_attn.v_proj.weight", {kv, c.dim});
    add("self_attn.o_proj.weight", {c.dim, q});
    if (c.qkv_bias) {
      add("self_attn.q_proj.bias", {q});
      add("self_attn.k_proj.bias", {kv});
      add("self_attn.v_proj.bias", {kv});
    }
    if (c.o_bias) add("self_attn.o_proj.bias", {c.dim});
    if (c.qk_norm) {
      add("self_attn.q_norm.weight", {c.head_dim});
      add("self_attn.k_norm.weight", {c.head_dim});
    }
    add("post_attention_layernorm.weight", {c.dim});
    add("mlp.gate_proj.weight", {c.ffn, c.dim});
    add("mlp.up_proj.weight", {c.ffn, c.dim});
    add("mlp.down_proj.weight", {c.dim, c.ffn});
    if (c.mlp_bias) {
      add("mlp.gate_proj.bias", {c.ffn});
      add("mlp.up_proj.bias", {c.ffn});
      add("mlp.down_proj.bias", {c.dim});
    }
  }
  out.push_back({"model.norm.weight", {c.dim}});
  if (!c.tie) out.push_back({"lm_head.weight", {c.vocab, c.dim}});
  return out;
}

int64_t HfModelBytes(const DecoderConfig& c) {
  // In doubles: the shapes are bounded (CheckShape) but their sum can pass 2^63 bytes.
  double values = 0;
  for (const HfTensorShape& t : HfTensorShapes(c)) {
    double n = 1;
    for (int64_t d : t.shape) n *= static_cast<double>(d);
    values += n;
  }
  return static_cast<int64_t>(std::min(values * sizeof(float), 9e18));
}

std::string HfConfigJson(const DecoderConfig& c) {
  static const char* kArchitectures[][2] = {{"llama", "LlamaForCausalLM"},
                                            {"mistral", "MistralForCausalLM"},
                                            {"qwen2", "Qwen2ForCausalLM"},
                                            {"qwen3", "Qwen3ForCausalLM"}};
  Json j;
  for (const auto& [type, arch] : kArchitectures) {
    if (c.model_type == type) j["architectures"] = {arch};
  }
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab;
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.ffn;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.context;
  j["rms_norm_eps"] = c.rms_eps;
  j["rope_theta"] = c.rope_theta;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie;
  j["torch_dtype"] = "float32";
  if (c.rope_type == "linear") j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_factor}};
  if (c.rope_type == "llama3") {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope_factor},
                         {"low_freq_factor", c.rope_low_freq_factor},
                         {"high_freq_factor", c.rope_high_freq_factor},
                         {"original_max_position_embeddings", c.rope_original_context}};
  }
  if (c.model_type == "llama" || c.model_type == "qwen3") j["attention_bias"] = c.qkv_bias;
  if (c.model_type == "llama") j["mlp_bias"] = c.mlp_bias;
  if (c.model_type == "mistral") {
    j["sliding_window"] = c.sliding_window > 0 ? Json(c.sliding_window) : Json(nullptr);
  }
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  return j.dump(2);
}

}  // namespace cleave
