#include "compression/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace cleave {

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  uint32_t mant = x & 0x7fffff;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  const int32_t e = exp - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00);  // too large: infinity
  auto round = [](uint32_t value, uint32_t rem, uint32_t mid) {
    return (rem > mid || (rem == mid && (value & 1))) ? value + 1 : value;
  };
  if (e <= 0) {  // a half subnormal (or zero)
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    const int shift = 14 - e;
    return static_cast<uint16_t>(
        sign | round(mant >> shift, mant & ((1u << shift) - 1), 1u << (shift - 1)));
  }
  // A carry out of the mantissa correctly moves to the next exponent (or infinity).
  return static_cast<uint16_t>(sign | round((e << 10) | (mant >> 13), mant & 0x1fff, 0x1000));
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0) {
    const float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  const uint32_t x = exp == 31 ? sign | 0x7f800000 | (mant << 13)
                               : sign | ((exp - 15 + 127) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

namespace {

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

Status Length(std::string_view bytes, int64_t expected, const std::string& codec) {
  if (static_cast<int64_t>(bytes.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(codec, " encoding of ", bytes.size(),
                                                   " bytes, expected ", expected));
  }
  return absl::OkStatus();
}

Status Finite(const std::vector<float>& v, const std::string& codec) {
  for (float x : v) {
    if (!std::isfinite(x)) return absl::InvalidArgumentError(codec + " values are not all finite");
  }
  return absl::OkStatus();
}

class NoneCodec : public Codec {
 public:
  std::string name() const override { return "none"; }
  void Encode(int, const float* in, int64_t n, std::string* out) override {
    out->append(reinterpret_cast<const char*>(in), n * sizeof(float));
  }
  int64_t EncodedSize(int64_t n) const override { return 4 * n; }
  Status Decode(std::string_view bytes, int64_t n, float* out) const override {
    RETURN_IF_ERROR(Length(bytes, 4 * n, name()));
    std::vector<float> v(n);
    std::memcpy(v.data(), bytes.data(), bytes.size());
    RETURN_IF_ERROR(Finite(v, name()));
    std::copy(v.begin(), v.end(), out);
    return absl::OkStatus();
  }
};

// fp16 and bf16: two bytes a value.
class HalfCodec : public Codec {
 public:
  explicit HalfCodec(bool bf16) : bf16_(bf16) {}
  std::string name() const override { return bf16_ ? "bf16" : "fp16"; }
  void Encode(int, const float* in, int64_t n, std::string* out) override {
    for (int64_t i = 0; i < n; ++i) Put(out, bf16_ ? FloatToBf16(in[i]) : FloatToHalf(in[i]));
  }
  int64_t EncodedSize(int64_t n) const override { return 2 * n; }
  Status Decode(std::string_view bytes, int64_t n, float* out) const override {
    RETURN_IF_ERROR(Length(bytes, 2 * n, name()));
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) {
      const auto h = Get<uint16_t>(bytes.data() + 2 * i);
      v[i] = bf16_ ? Bf16ToFloat(h) : HalfToFloat(h);
    }
    RETURN_IF_ERROR(Finite(v, name()));
    std::copy(v.begin(), v.end(), out);
    return absl::OkStatus();
  }

 private:
  const bool bf16_;
};

// int8 with one scale per tensor.
class Int8Codec : public Codec {
 public:
  Int8Codec(bool stochastic, uint64_t seed) : stochastic_(stochastic), rng_(seed) {}
  std::string name() const override { return stochastic_ ? "int8:sr" : "int8"; }
  void Encode(int, const float* in, int64_t n, std::string* out) override {
    float max = 0;
    for (int64_t i = 0; i < n; ++i) max = std::max(max, std::abs(in[i]));
    const float scale = max / 127.0f;
    Put(out, scale);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) {
      float q = scale > 0 ? in[i] / scale : 0.0f;
      q = stochastic_ ? std::floor(q + u(rng_)) : std::nearbyint(q);
      out->push_back(static_cast<char>(static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f))));
    }
  }
  int64_t EncodedSize(int64_t n) const override { return 4 + n; }
  Status Decode(std::string_view bytes, int64_t n, float* out) const override {
    RETURN_IF_ERROR(Length(bytes, 4 + n, name()));
    const float scale = Get<float>(bytes.data());
    if (!std::isfinite(scale) || scale < 0) {
      return absl::InvalidArgumentError("int8 scale is not a finite number >= 0");
    }
    for (int64_t i = 0; i < n; ++i) {
      if (static_cast<int8_t>(bytes[4 + i]) == -128) {
        return absl::InvalidArgumentError("int8 value -128 is outside [-127, 127]");
      }
    }
    for (int64_t i = 0; i < n; ++i) out[i] = scale * static_cast<int8_t>(bytes[4 + i]);
    return absl::OkStatus();
  }

 private:
  const bool stochastic_;
  std::mt19937_64 rng_;
};

// Top-k with error feedback: u32 k, k u32 indices (increasing), k float32 values.
class TopKCodec : public Codec {
 public:
  explicit TopKCodec(double fraction) : fraction_(fraction) {}
  std::string name() const override { return absl::StrCat("topk:", fraction_); }

  int64_t K(int64_t n) const {
    return n == 0 ? 0 : std::clamp<int64_t>(std::ceil(fraction_ * n), 1, n);
  }
  int64_t EncodedSize(int64_t n) const override { return 4 + 8 * K(n); }

  void Encode(int slot, const float* in, int64_t n, std::string* out) override {
    std::vector<float>& v = residual_[slot];
    v.resize(n, 0.0f);
    for (int64_t i = 0; i < n; ++i) v[i] += in[i];  // what is owed: input + residual
    const int64_t k = K(n);
    std::vector<uint32_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0u);
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(), [&](uint32_t a, uint32_t b) {
      return std::abs(v[a]) > std::abs(v[b]);
    });
    idx.resize(k);
    std::sort(idx.begin(), idx.end());
    Put(out, static_cast<uint32_t>(k));
    for (uint32_t i : idx) Put(out, i);
    for (uint32_t i : idx) {
      Put(out, v[i]);
      v[i] = 0.0f;  // sent: nothing of it is owed any more
    }
  }

  Status Decode(std::string_view bytes, int64_t n, float* out) const override {
    if (bytes.size() < 4) return absl::InvalidArgumentError("topk encoding without a count");
    const int64_t k = Get<uint32_t>(bytes.data());
    if (k > n) {
      return absl::InvalidArgumentError(absl::StrCat("topk sends ", k, " of ", n, " values"));
    }
    RETURN_IF_ERROR(Length(bytes, 4 + 8 * k, "topk"));
    const char* p = bytes.data() + 4;
    std::vector<std::pair<uint32_t, float>> entries(k);
    for (int64_t j = 0; j < k; ++j) {
      const uint32_t i = Get<uint32_t>(p + 4 * j);
      const float value = Get<float>(p + 4 * k + 4 * j);
      if (i >= n || (j > 0 && i <= entries[j - 1].first)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "topk index ", i, " is out of range or not increasing (n = ", n, ")"));
      }
      if (!std::isfinite(value)) return absl::InvalidArgumentError("topk value is not finite");
      entries[j] = {i, value};
    }
    std::fill(out, out + n, 0.0f);
    for (const auto& [i, value] : entries) out[i] = value;
    return absl::OkStatus();
  }

  std::vector<float> Residual(int slot) const override {
    auto it = residual_.find(slot);
    return it == residual_.end() ? std::vector<float>() : it->second;
  }

 private:
  const double fraction_;
  std::map<int, std::vector<float>> residual_;
};

}  // namespace

std::string CodecFamily(const std::string& spec) {
  if (spec.empty() || spec == "fp32") return "none";
  if (spec.rfind("topk:", 0) == 0) return "topk";
  return spec;
}

std::vector<std::string> SupportedCodecFamilies() {
  return {"none", "fp16", "bf16", "int8", "int8:sr", "topk"};
}

std::string EncodeTensors(Codec& codec, const ParameterSet& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& t = values.tensors()[i];
    codec.Encode(static_cast<int>(i), t.values.data(), static_cast<int64_t>(t.values.size()), &out);
  }
  return out;
}

int64_t EncodedTensorsSize(const Codec& codec, const ParameterSet& layout) {
  int64_t n = 0;
  for (const auto& t : layout.tensors()) n += codec.EncodedSize(t.numel());
  return n;
}

StatusOr<ParameterSet> DecodeTensors(const Codec& codec, std::string_view bytes,
                                     const ParameterSet& layout) {
  if (static_cast<int64_t>(bytes.size()) != EncodedTensorsSize(codec, layout)) {
    return absl::InvalidArgumentError(absl::StrCat(codec.name(), " update of ", bytes.size(),
                                                   " bytes, expected ",
                                                   EncodedTensorsSize(codec, layout)));
  }
  ParameterSet out = layout.ZerosLike();
  size_t offset = 0;
  for (auto& t : out.mutable_tensors()) {
    const int64_t size = codec.EncodedSize(t.numel());
    if (Status s = codec.Decode(bytes.substr(offset, size), t.numel(), t.values.data()); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": ", s.message()));
    }
    offset += size;
  }
  return out;
}

std::string EncodeValues(Codec* codec, const std::vector<float>& values) {
  if (codec == nullptr) {
    return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
  }
  std::string out;
  codec->Encode(0, values.data(), static_cast<int64_t>(values.size()), &out);
  return out;
}

StatusOr<std::vector<float>> DecodeValues(const Codec* codec, std::string_view bytes, int64_t n) {
  static const NoneCodec kNone;
  const Codec& c = codec ? *codec : kNone;
  // Checked before allocating: the shape comes from the same untrusted message.
  RETURN_IF_ERROR(Length(bytes, c.EncodedSize(n), c.name()));
  std::vector<float> v(n);
  RETURN_IF_ERROR(c.Decode(bytes, n, v.data()));
  return v;
}

StatusOr<std::unique_ptr<Codec>> MakeStatelessCodec(const std::string& spec, uint64_t seed) {
  if (CodecFamily(spec) == "none") return std::unique_ptr<Codec>();
  if (CodecFamily(spec) == "topk") {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec ", spec, " keeps a residual across calls; activations and gradients change "
        "every batch (use fp16, bf16, int8 or int8:sr)"));
  }
  return MakeCodec(spec, seed);
}

StatusOr<std::unique_ptr<Codec>> MakeCodec(const std::string& spec, uint64_t seed) {
  if (spec == "none" || spec == "fp32") return std::unique_ptr<Codec>(new NoneCodec());
  if (spec == "fp16") return std::unique_ptr<Codec>(new HalfCodec(false));
  if (spec == "bf16") return std::unique_ptr<Codec>(new HalfCodec(true));
  if (spec == "int8") return std::unique_ptr<Codec>(new Int8Codec(false, seed));
  if (spec == "int8:sr") return std::unique_ptr<Codec>(new Int8Codec(true, seed));
  if (spec.rfind("topk:", 0) == 0) {
    double f = 0;
    if (!absl::SimpleAtod(spec.substr(5), &f) || !(f > 0 && f <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat("codec ", spec, ": F must be in (0, 1]"));
    }
    return std::unique_ptr<Codec>(new TopKCodec(f));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown codec '", spec, "' (none, fp16, bf16, int8, int8:sr, topk:F)"));
}

}  // namespace cleave
