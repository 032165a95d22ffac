#include "models/options.h"

#include "absl/strings/str_cat.h"
#include "models/kinds.h"

namespace cleave {

const NameTable& InteropBaseNames() {
  static const NameTable t{"model.interop.base", {"mlp", "lenet5", "cnn"}};
  return t;
}

const NameTable& LoraTargetNames() {
  static const NameTable t{"model.lora.targets",
                           {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "q_proj", "k_proj",
                            "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}};
  return t;
}

void ReadModel(ConfigSection& s, ModelConfig& c) {
  s.Read("name", c.name);
  s.ReadPath("path", c.path);
  s.Read("input", c.input);
  s.Read("classes", c.classes);
  s.Read("personal", c.personal);
  s.ReadPath("weights", c.weights);
  s.Read("quantize", c.quantize);
  s.Read("double_quant", c.double_quant);
  s.Read("batch_norm", c.batch_norm);
  ConfigSection g = s.Section("gpt");
  g.Read("vocab", c.gpt.vocab);
  g.Read("context", c.gpt.context);
  g.Read("layers", c.gpt.layers);
  g.Read("heads", c.gpt.heads);
  g.Read("dim", c.gpt.dim);
  g.Read("tie", c.gpt.tie);
  ConfigSection x = s.Section("interop");
  x.Read("base", c.interop.base);
  x.Read("width", c.interop.width);
  x.ForEach("clients", [&c](ConfigSection& item) {
    InteropConfig::Client client;
    item.Read("name", client.name);
    item.Read("base", client.base);
    if (item.given()) c.interop.clients.push_back(client);
  });
  ConfigSection l = s.Section("lora");
  l.Read("rank", c.lora.rank);
  l.Read("alpha", c.lora.alpha);
  l.Read("targets", c.lora.targets);
  l.Read("dropout", c.lora.dropout);
}

namespace {

Status CheckGpt(const GptConfig& g) {
  RETURN_IF_ERROR(Range(g.vocab >= 2 && g.vocab <= (1 << 24), "model.gpt.vocab", "in [2, 16777216]"));
  RETURN_IF_ERROR(Range(g.context >= 1 && g.context <= 65536, "model.gpt.context", "in [1, 65536]"));
  RETURN_IF_ERROR(Range(g.layers >= 1 && g.layers <= 256, "model.gpt.layers", "in [1, 256]"));
  RETURN_IF_ERROR(Range(g.heads >= 1 && g.heads <= 256, "model.gpt.heads", "in [1, 256]"));
  return Range(g.dim >= 1 && g.dim <= 65536 && g.dim % g.heads == 0, "model.gpt.dim",
               "in [1, 65536] and divisible by model.gpt.heads");
}

Status CheckLora(const ModelConfig& c) {
  const LoraConfig& lora = c.lora;
  RETURN_IF_ERROR(Range(lora.rank >= 0 && lora.rank <= 4096, "model.lora.rank", "in [0, 4096]"));
  RETURN_IF_ERROR(Range(lora.alpha > 0, "model.lora.alpha", "> 0"));
  RETURN_IF_ERROR(Range(lora.dropout >= 0 && lora.dropout < 1, "model.lora.dropout", "in [0, 1)"));
  for (const std::string& t : lora.targets) RETURN_IF_ERROR(LoraTargetNames().Check(t));
  if (lora.enabled()) {
    RETURN_IF_ERROR(Range(ModelTraitsOf(c.name).tokens(), "model.lora",
                          "used with model.name gpt or hf"));
    RETURN_IF_ERROR(Range(c.personal.empty(), "model.lora",
                          "off with model.personal (the adapters are what is federated)"));
  }
  return absl::OkStatus();
}

Status CheckInterop(const ModelConfig& c) {
  const InteropConfig& x = c.interop;
  RETURN_IF_ERROR(InteropBaseNames().Check(x.base));
  RETURN_IF_ERROR(Range(x.width >= 1 && x.width <= 65536, "model.interop.width", "in [1, 65536]"));
  for (const InteropConfig::Client& client : x.clients) {
    RETURN_IF_ERROR(Range(!client.name.empty(), "model.interop.clients[].name", "a client's name"));
    if (Status s = InteropBaseNames().Check(client.base); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("model.interop.clients[].base: ", s.message()));
    }
  }
  if (ModelTraitsOf(c.name).has_private_tensors()) {
    RETURN_IF_ERROR(Range(c.personal.empty() && !c.lora.enabled() && c.weights.empty(), "model.name interop",
                          "without model.personal, model.lora and model.weights (the bases are the "
                          "devices' own)"));
  }
  return absl::OkStatus();
}

Status CheckQuantize(const ModelConfig& c) {
  RETURN_IF_ERROR(Range(c.quantize == "none" || c.quantize == "int8" || c.quantize == "nf4",
                        "model.quantize", "none, int8 or nf4"));
  if (c.double_quant) RETURN_IF_ERROR(Range(c.quantize == "nf4", "model.double_quant", "used with model.quantize: nf4"));
  if (c.quantize == "none") return absl::OkStatus();
  RETURN_IF_ERROR(Range(ModelTraitsOf(c.name).hf_folder, "model.quantize", "used with model.name: hf"));
  RETURN_IF_ERROR(Range(c.lora.enabled(), "model.quantize",
                        "used with LoRA (model.lora.rank > 0): a quantized base is frozen"));
  return Range(c.weights.empty(), "model.quantize",
               "used with the weights of model.path (not model.weights)");
}

}  // namespace

std::string QuantizeCodec(const ModelConfig& c) {
  if (c.quantize == "int8") return "int8:channel";
  if (c.quantize == "nf4") return c.double_quant ? "nf4:dq" : "nf4";
  return "";
}

Status CheckModel(ModelConfig& c) {
  RETURN_IF_ERROR(Range(!c.input.empty() && c.input.size() <= 3, "model.input",
                        "[C, H, W] or [features]"));
  for (int64_t d : c.input) {
    RETURN_IF_ERROR(Range(d >= 1 && d <= 65536, "model.input", "a list of sizes in [1, 65536]"));
  }
  RETURN_IF_ERROR(Range(c.classes >= 1 && c.classes <= 1000000, "model.classes", "in [1, 1000000]"));
  RETURN_IF_ERROR(CheckGpt(c.gpt));
  RETURN_IF_ERROR(CheckLora(c));
  RETURN_IF_ERROR(CheckQuantize(c));
  RETURN_IF_ERROR(CheckInterop(c));
  RETURN_IF_ERROR(Range(c.batch_norm == "running" || c.batch_norm == "static", "model.batch_norm",
                        "running or static"));
  if (c.batch_norm == "static") {
    RETURN_IF_ERROR(Range(ModelTraitsOf(c.name).batch_norm, "model.batch_norm: static", "used with model.name resnet"));
  }
  for (const std::string& p : c.personal) {
    RETURN_IF_ERROR(Range(!p.empty(), "model.personal", "a list of tensor name patterns"));
  }
  if (const ModelTraits kind = ModelTraitsOf(c.name); (kind.scripted || kind.hf_folder) && c.path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model.path is required for model.name: ", c.name));
  }
  return absl::OkStatus();
}

}  // namespace cleave
