#include "models/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/files.h"
#include "core/json.h"

namespace cleave {
namespace {

using Json = nlohmann::json;

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((m & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The dtypes this reads, parsed once per tensor.
enum class Dtype { kUnknown, kF32, kF64, kF16, kBF16 };

Dtype ParseDtype(const std::string& dtype) {
  if (dtype == "F32") return Dtype::kF32;
  if (dtype == "F64") return Dtype::kF64;
  if (dtype == "F16") return Dtype::kF16;
  if (dtype == "BF16") return Dtype::kBF16;
  return Dtype::kUnknown;
}

// Bytes per element; 0 for a dtype this does not read.
size_t DtypeSize(const std::string& dtype) {
  switch (ParseDtype(dtype)) {
    case Dtype::kF32: return 4;
    case Dtype::kF64: return 8;
    case Dtype::kF16:
    case Dtype::kBF16: return 2;
    case Dtype::kUnknown: break;
  }
  return 0;
}

// `n` values of `dtype` (one DtypeSize reads) at `src` as float32 into `out`.
void Convert(const std::string& dtype, const char* src, int64_t n, float* out) {
  switch (ParseDtype(dtype)) {
    case Dtype::kF32:
      if (n > 0) std::memcpy(out, src, 4 * static_cast<size_t>(n));
      return;
    case Dtype::kF64:
      for (int64_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, src + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      return;
    case Dtype::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        out[i] = HalfToFloat(h);
      }
      return;
    case Dtype::kBF16:  // the top half of a float32
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        const uint32_t bits = uint32_t{h} << 16;
        std::memcpy(&out[i], &bits, 4);
      }
      return;
    case Dtype::kUnknown: break;  // refused when the header was read
  }
}

}  // namespace

StatusOr<ParameterSet> ParseSafetensors(std::string_view bytes, const std::string& what) {
  return ParseSafetensors(bytes, what, SafetensorsFilter{});
}

namespace {

// The header's entries, sorted by where their data begins, and the data after the header.
StatusOr<std::pair<std::vector<SafetensorsEntry>, std::string_view>> ReadHeader(std::string_view bytes,
                                                                               const std::string& what) {
  auto loss = [&](const std::string& m) { return absl::DataLossError(what + ": " + m); };
  if (bytes.size() < 8) return loss("not a safetensors file (shorter than its 8-byte header size)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  if (n > bytes.size() - 8) {
    return loss(absl::StrCat("header of ", n, " bytes but the file holds ", bytes.size() - 8,
                             " after its size (truncated?)"));
  }
  auto parsed = ParseJsonObject(bytes.substr(8, n), "the header");
  if (!parsed.ok()) return loss(std::string(parsed.status().message()));
  const Json& header = *parsed;
  const std::string_view data = bytes.substr(8 + n);
  // Tensors in the order of their data (the header's key order is not kept by JSON).
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = absl::StrCat("tensor ", name);
    if (!info.is_object() || !info.contains("dtype") || !info["dtype"].is_string() ||
        !info.contains("shape") || !info["shape"].is_array() || !info.contains("data_offsets") ||
        !info["data_offsets"].is_array() || info["data_offsets"].size() != 2) {
      return loss(where + ": needs dtype, shape and data_offsets [begin, end]");
    }
    SafetensorsEntry e{name, info["dtype"].get<std::string>(), {}, 0, 0};
    if (DtypeSize(e.dtype) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", where, " has dtype ", e.dtype,
                                                     " (F32, F16, BF16 or F64 are read)"));
    }
    // Counted with care: the shape is untrusted, and its product must not overflow.
    constexpr uint64_t kMaxElements = uint64_t{1} << 40;
    uint64_t numel = 1;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_unsigned()) return loss(where + ": shape must be non-negative integers");
      const uint64_t n = d.get<uint64_t>();
      if (n > kMaxElements || (n != 0 && numel > kMaxElements / n)) {
        return loss(where + ": more than 2^40 elements");
      }
      numel *= n;
      e.shape.push_back(static_cast<int64_t>(n));
    }
    const auto& off = info["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return loss(where + ": data_offsets must be non-negative integers");
    }
    e.begin = off[0].get<uint64_t>();
    e.end = off[1].get<uint64_t>();
    if (e.begin > e.end || e.end - e.begin != numel * DtypeSize(e.dtype)) {
      return loss(absl::StrCat(where, ": data_offsets [", e.begin, ", ", e.end, ") do not hold ",
                               absl::StrJoin(e.shape, "x"), " ", e.dtype, " values"));
    }
    if (e.end > data.size()) {
      return loss(absl::StrCat(where, " ends at byte ", e.end, " of the data but the file holds ",
                               data.size(), " (truncated?)"));
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].begin < entries[i - 1].end) {
      return loss(absl::StrCat("tensors ", entries[i - 1].name, " and ", entries[i].name, " overlap"));
    }
  }
  return std::make_pair(std::move(entries), data);
}

}  // namespace

StatusOr<std::vector<SafetensorsEntry>> SafetensorsEntries(std::string_view bytes, const std::string& what) {
  ASSIGN_OR_RETURN(auto header, ReadHeader(bytes, what));
  return std::move(header.first);
}

StatusOr<ParameterSet> ParseSafetensors(std::string_view bytes, const std::string& what,
                                        const SafetensorsFilter& filter) {
  ASSIGN_OR_RETURN(auto header, ReadHeader(bytes, what));
  const std::vector<SafetensorsEntry>& entries = header.first;
  const std::string_view data = header.second;
  ParameterSet out;
  for (size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& e = entries[i];
    if (filter.wanted && !filter.wanted(e.name)) continue;
    float* into = nullptr;
    if (filter.into) {
      ASSIGN_OR_RETURN(into, filter.into(e.name, e.shape));
    }
    if (into != nullptr) {
      constexpr int64_t kSlice = int64_t{1} << 18;  // values: 1 MiB of float32
      const int64_t numel = NumElements(e.shape);
      const size_t size = DtypeSize(e.dtype);
      for (int64_t at = 0; at < numel; at += kSlice) {
        const int64_t n = std::min(kSlice, numel - at);
        const char* src = data.data() + e.begin + at * size;
        Convert(e.dtype, src, n, into + at);
        if (filter.done) filter.done(src, n * size);
      }
      continue;
    }
    Tensor t;
    t.name = e.name;
    t.shape = e.shape;
    t.values.resize(NumElements(e.shape));
    Convert(e.dtype, data.data() + e.begin, t.numel(), t.values.data());
    if (filter.done) filter.done(data.data() + e.begin, e.end - e.begin);
    RETURN_IF_ERROR(out.Add(std::move(t)));
  }
  return out;
}

std::string SerializeSafetensors(const ParameterSet& params,
                                 const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Tensor& t : params.tensors()) {
    const uint64_t bytes = t.values.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t{text.size()} >> (8 * i)) & 0xff);
  out += text;
  out.reserve(out.size() + offset);
  for (const Tensor& t : params.tensors()) {
    out.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
  }
  return out;
}

namespace {

// "0.wte.weight" -> "wte.weight", "3.attn.c_attn.bias" -> "h.2.attn.c_attn.bias",
// "{last}.ln_f.weight" -> "ln_f.weight"; `last` is the head's stage.
std::string Gpt2Name(const std::string& name, int last) {
  const size_t dot = name.find('.');
  int stage = 0;
  if (dot == std::string::npos || !absl::SimpleAtoi(name.substr(0, dot), &stage)) return name;
  const std::string rest = name.substr(dot + 1);
  if (stage == 0 || stage == last) return rest;
  return absl::StrCat("h.", stage - 1, ".", rest);
}

int LastStage(const ParameterSet& model) {
  int last = 0;
  for (const Tensor& t : model.tensors()) {
    int stage = 0;
    if (absl::SimpleAtoi(t.name.substr(0, t.name.find('.')), &stage)) last = std::max(last, stage);
  }
  return last;
}

}  // namespace

ParameterSet ToGpt2Layout(const ParameterSet& model) {
  const int last = LastStage(model);
  ParameterSet out;
  for (Tensor t : model.tensors()) {
    t.name = Gpt2Name(t.name, last);
    out.Add(std::move(t)).IgnoreError();  // the mapping is one to one
  }
  return out;
}

StatusOr<ParameterSet> FromGpt2Layout(const ParameterSet& file, const ParameterSet& layout,
                                      const std::string& what) {
  const int last = LastStage(layout);
  std::unordered_map<std::string, size_t> index;  // GPT-2 name -> tensor of `layout`
  for (size_t i = 0; i < layout.size(); ++i) index[Gpt2Name(layout.tensors()[i].name, last)] = i;
  std::vector<const Tensor*> found(layout.size(), nullptr);
  for (const Tensor& t : file.tensors()) {
    std::string name = t.name;
    if (absl::StartsWith(name, "transformer.")) name = name.substr(12);
    if (absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias")) continue;
    const auto it = index.find(name);
    if (it == index.end()) {
      if (name == "lm_head.weight") continue;  // tied: the head is wte
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": tensor ", t.name, " has no place in model gpt with ", last - 1,
          " layers (model.gpt.layers, and GPT-2's tensor names)"));
    }
    const Tensor& want = layout.tensors()[it->second];
    if (t.shape != want.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": tensor ", t.name, " is ", absl::StrJoin(t.shape, "x"), " but the model's is ",
          absl::StrJoin(want.shape, "x"), " (model.gpt's vocab, context and dim)"));
    }
    found[it->second] = &t;
  }
  ParameterSet out;
  for (size_t i = 0; i < layout.size(); ++i) {
    const std::string& name = layout.tensors()[i].name;
    const Tensor* src = found[i];
    if (src == nullptr && Gpt2Name(name, last) == "lm_head.weight") {
      src = found[index.at("wte.weight")];  // GPT-2 ties its head to wte
    }
    if (src == nullptr && absl::StrContains(name, ".lora_")) src = &layout.tensors()[i];
    if (src == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": no tensor ", Gpt2Name(name, last), " (the model's ", name, ")"));
    }
    Tensor t = *src;
    t.name = name;
    RETURN_IF_ERROR(out.Add(std::move(t)));
  }
  return out;
}

ParameterSet MergeLora(const ParameterSet& model, double scale) {
  ParameterSet out;
  for (const Tensor& t : model.tensors()) {
    if (absl::StrContains(t.name, ".lora_")) continue;
    Tensor merged = t;
    const std::string prefix = absl::EndsWith(t.name, ".weight")
                                   ? t.name.substr(0, t.name.size() - 7)
                                   : std::string();
    const Tensor* a = prefix.empty() ? nullptr : model.Find(prefix + ".lora_A");
    const Tensor* b = prefix.empty() ? nullptr : model.Find(prefix + ".lora_B");
    if (a != nullptr && b != nullptr && t.shape.size() == 2 && a->shape.size() == 2 &&
        b->shape.size() == 2) {
      // W [rows, cols] += scale X Y: GPT-2's Conv1D keeps W [in, out], A [in, r], B [r,
      // out] (X = A); nn.Linear W [out, in] with PEFT's A [r, in], B [out, r] (X = B).
      const bool conv1d = a->shape[0] == t.shape[0] && b->shape[1] == t.shape[1];
      const Tensor& x = conv1d ? *a : *b;
      const Tensor& y = conv1d ? *b : *a;
      const int64_t rows = t.shape[0], cols = t.shape[1], rank = x.shape[1];
      if (x.shape[0] != rows || y.shape != std::vector<int64_t>{rank, cols}) std::abort();  // our own model's adapters always fit: a bug
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t k = 0; k < rank; ++k) {
          const double aik = scale * x.values[i * rank + k];
          const float* brow = &y.values[k * cols];
          float* wrow = &merged.values[i * cols];
          for (int64_t j = 0; j < cols; ++j) wrow[j] += static_cast<float>(aik * brow[j]);
        }
      }
    }
    out.Add(std::move(merged)).IgnoreError();  // names from a parameter set are unique
  }
  return out;
}

StatusOr<ParameterSet> LoadWeights(const std::string& path, const std::string& model_name,
                                   const ParameterSet& layout) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  ASSIGN_OR_RETURN(ParameterSet file, ParseSafetensors(bytes, path));
  if (model_name == "gpt") return FromGpt2Layout(file, layout, path);
  ParameterSet out;
  for (const Tensor& want : layout.tensors()) {
    const Tensor* t = file.Find(want.name);
    if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat(path, ": no tensor ", want.name));
    if (t->shape != want.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", want.name, " is ", absl::StrJoin(t->shape, "x"), " but the model's is ",
          absl::StrJoin(want.shape, "x")));
    }
    RETURN_IF_ERROR(out.Add(*t));
  }
  if (file.size() != layout.size()) {
    for (const Tensor& t : file.tensors()) {
      if (layout.Find(t.name) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor ", t.name, " is not one of model ", model_name, "'s"));
      }
    }
  }
  return out;
}

}  // namespace cleave
