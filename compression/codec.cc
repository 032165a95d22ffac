#include "compression/codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "compression/codec_internal.h"
#include "compression/kernels.h"

namespace cleave {

using namespace codec_internal;  // NOLINT: the codecs' byte helpers and factories

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

class NoneCodec : public Codec {
 public:
  NoneCodec() : Codec("none") {}
  void Encode(int, const float* in, const Shape& shape, std::string* out) override {
    out->append(reinterpret_cast<const char*>(in), NumElements(shape) * sizeof(float));
  }
  int64_t EncodedSize(const Shape& shape) const override { return 4 * NumElements(shape); }
  Status Check(std::string_view bytes, const Shape& shape) const override {
    RETURN_IF_ERROR(Length(bytes, EncodedSize(shape), name()));
    if (kernels::AllFinite(bytes.data(), NumElements(shape))) return absl::OkStatus();
    return FiniteFloats(bytes.data(), NumElements(shape), "value");
  }
  void DecodeRange(std::string_view bytes, const Shape&, int64_t begin, int64_t count,
                   float* out) const override {
    std::memcpy(out, bytes.data() + 4 * begin, 4 * count);
  }
};

// fp16 and bf16: two bytes a value.
class HalfCodec : public Codec {
 public:
  explicit HalfCodec(bool bf16) : Codec(bf16 ? "bf16" : "fp16"), bf16_(bf16) {}
  void Encode(int, const float* in, const Shape& shape, std::string* out) override {
    const int64_t n = NumElements(shape);
    char* p = Grow(out, 2 * n);
    bf16_ ? kernels::ToBf16(in, n, p) : kernels::ToHalf(in, n, p);
  }
  int64_t EncodedSize(const Shape& shape) const override { return 2 * NumElements(shape); }
  Status Check(std::string_view bytes, const Shape& shape) const override {
    RETURN_IF_ERROR(Length(bytes, EncodedSize(shape), name()));
    const uint16_t exp_mask = bf16_ ? 0x7f80 : 0x7c00;
    const int64_t n = NumElements(shape);
    if (kernels::NoneMasked16(bytes.data(), n, exp_mask)) return absl::OkStatus();
    for (int64_t i = 0; i < n; ++i) {
      if ((Get<uint16_t>(bytes.data() + 2 * i) & exp_mask) == exp_mask) {
        return absl::InvalidArgumentError(absl::StrCat(name(), " value ", i, " is not finite"));
      }
    }
    return absl::OkStatus();
  }
  void DecodeRange(std::string_view bytes, const Shape&, int64_t begin, int64_t count,
                   float* out) const override {
    const char* p = bytes.data() + 2 * begin;
    bf16_ ? kernels::FromBf16(p, count, out) : kernels::FromHalf(p, count, out);
  }

 private:
  const bool bf16_;
};

// int8: a scale per group of values, then a signed byte per value. The groups are the
// whole tensor (int8), each row (int8:channel) or each vector along the last dimension
// (int8:token: a token's activation in [batch, tokens, dim]); scales are float32, but
// per-token ones are many (one per `dim` values), so they travel as bfloat16, rounded up
// so that no value exceeds 127 steps.
class Int8Codec : public Codec {
 public:
  enum class Grouping { kTensor, kRow, kLastDim };
  Int8Codec(std::string name, bool stochastic, Grouping grouping, uint64_t seed)
      : Codec(std::move(name)), stochastic_(stochastic), grouping_(grouping), rng_(seed) {}

  int64_t Groups(const Shape& shape) const {
    switch (grouping_) {
      case Grouping::kTensor: return 1;
      case Grouping::kRow: return Rows(shape);
      case Grouping::kLastDim:
        return shape.size() < 2 || shape.back() == 0 ? 1 : NumElements(shape) / shape.back();
    }
    return 1;
  }
  int ScaleBytes() const { return grouping_ == Grouping::kLastDim ? 2 : 4; }
  int64_t EncodedSize(const Shape& shape) const override {
    return ScaleBytes() * Groups(shape) + NumElements(shape);
  }

  void Encode(int, const float* in, const Shape& shape, std::string* out) override {
    const int64_t n = NumElements(shape), groups = Groups(shape);
    const int64_t per = groups == 0 ? 0 : n / groups;
    char* p = Grow(out, EncodedSize(shape));
    auto* q = reinterpret_cast<int8_t*>(p + ScaleBytes() * groups);
    const uint32_t seed = stochastic_ ? CallSeed(rng_) : 0;
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = in + g * per;
      float scale = kernels::MaxAbs(x, per) / 127.0f;
      if (ScaleBytes() == 2) {
        const uint16_t b = Bf16Up(scale);
        std::memcpy(p + 2 * g, &b, 2);
        scale = Bf16ToFloat(b);
      } else {
        std::memcpy(p + 4 * g, &scale, 4);
      }
      if (stochastic_) {
        kernels::QuantizeStochastic(x, per, scale, seed + static_cast<uint32_t>(g) * 0x85ebca6bu,
                                    q + g * per);
      } else {
        kernels::QuantizeNearest(x, per, scale, q + g * per);
      }
    }
  }

  Status Check(std::string_view bytes, const Shape& shape) const override {
    RETURN_IF_ERROR(Length(bytes, EncodedSize(shape), name()));
    const int64_t groups = Groups(shape);
    for (int64_t g = 0; g < groups; ++g) RETURN_IF_ERROR(CheckScale(Scale(bytes, g), 127.0f, name()));
    if (kernels::AnyMinus128(reinterpret_cast<const int8_t*>(bytes.data() + ScaleBytes() * groups),
                             NumElements(shape))) {
      return absl::InvalidArgumentError(name() + " value -128 is outside [-127, 127]");
    }
    return absl::OkStatus();
  }

  void DecodeRange(std::string_view bytes, const Shape& shape, int64_t begin, int64_t count,
                   float* out) const override {
    if (count == 0) return;
    const int64_t groups = Groups(shape), per = NumElements(shape) / groups;
    const auto* q = reinterpret_cast<const int8_t*>(bytes.data() + ScaleBytes() * groups);
    for (int64_t i = begin; i < begin + count;) {
      const int64_t g = i / per, end = std::min(begin + count, (g + 1) * per);
      kernels::Dequantize(q + i, end - i, Scale(bytes, g), out + (i - begin));
      i = end;
    }
  }

 private:
  float Scale(std::string_view bytes, int64_t g) const {
    return ScaleBytes() == 2 ? Bf16ToFloat(Get<uint16_t>(bytes.data() + 2 * g))
                             : Get<float>(bytes.data() + 4 * g);
  }
  // The smallest bfloat16 >= s (s finite and >= 0).
  static uint16_t Bf16Up(float s) {
    uint32_t bits;
    std::memcpy(&bits, &s, 4);
    return static_cast<uint16_t>((bits >> 16) + ((bits & 0xffffu) != 0 ? 1 : 0));
  }

  const bool stochastic_;
  const Grouping grouping_;
  std::mt19937_64 rng_;
};

// Fields of `bits` bits (1..8), little-endian bit order.
void Pack(const uint8_t* fields, int64_t n, int bits, char* out) {
  auto* o = reinterpret_cast<uint8_t*>(out);
  const int per = 8 / bits;
  if (bits == 8) {
    std::memcpy(o, fields, n);
  } else if (bits == 4) {
    for (int64_t b = 0; b < n / 2; ++b) o[b] = static_cast<uint8_t>(fields[2 * b] | fields[2 * b + 1] << 4);
    if (n % 2) o[n / 2] = fields[n - 1];
  } else if (bits == 2 || bits == 1) {
    for (int64_t b = 0; b < (n + per - 1) / per; ++b) {
      uint8_t byte = 0;
      for (int j = 0; j < per && b * per + j < n; ++j) byte |= fields[b * per + j] << (j * bits);
      o[b] = byte;
    }
  } else {
    std::string packed;
    BitWriter w(&packed, bits);
    for (int64_t i = 0; i < n; ++i) w.Put(fields[i]);
    w.Flush();
    std::memcpy(o, packed.data(), packed.size());
  }
}

void Unpack(const char* p, int64_t size, int bits, int64_t first, int64_t n, uint8_t* fields) {
  const auto* b = reinterpret_cast<const uint8_t*>(p);
  if (bits == 8) {
    std::memcpy(fields, b + first, n);
  } else if (bits == 4) {
    int64_t i = 0;
    if (first % 2 && n > 0) fields[i++] = b[first >> 1] >> 4;
    for (; i + 2 <= n; i += 2) {
      const uint8_t byte = b[(first + i) >> 1];
      fields[i] = byte & 15;
      fields[i + 1] = byte >> 4;
    }
    if (i < n) fields[i] = b[(first + i) >> 1] & 15;
  } else if (bits == 2) {
    for (int64_t i = 0; i < n; ++i) fields[i] = (b[(first + i) >> 2] >> (((first + i) & 3) * 2)) & 3;
  } else {
    for (int64_t i = 0; i < n; ++i) fields[i] = static_cast<uint8_t>(Field(p, first + i, bits, size));
  }
}

// QSGD: per bucket of kBucket values a float32 norm, then the values' fields (level + S,
// in 0..2S) packed in `bits_` bits each.
class QsgdCodec : public Codec {
 public:
  static constexpr int64_t kBucket = 512;
  QsgdCodec(std::string name, int levels, uint64_t seed)
      : Codec(std::move(name)), s_(levels), bits_(BitsFor(levels)), rng_(seed) {}

  static int BitsFor(int levels) {
    int b = 1;
    while ((1 << b) < 2 * levels + 1) ++b;
    return b;
  }
  static int64_t Buckets(int64_t n) { return (n + kBucket - 1) / kBucket; }
  int64_t EncodedSize(const Shape& shape) const override {
    const int64_t n = NumElements(shape);
    return 4 * Buckets(n) + PackedSize(n, bits_);
  }

  void Encode(int, const float* in, const Shape& shape, std::string* out) override {
    const int64_t n = NumElements(shape), nb = Buckets(n);
    char* p = Grow(out, EncodedSize(shape));
    std::vector<uint8_t> fields(n);
    const uint32_t seed = CallSeed(rng_);
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t first = b * kBucket, len = std::min(n, first + kBucket) - first;
      const float norm = static_cast<float>(std::sqrt(kernels::SumSquares(in + first, len)));
      std::memcpy(p + 4 * b, &norm, 4);
      kernels::QsgdFields(in + first, len, norm, s_, seed, static_cast<uint32_t>(first),
                          fields.data() + first);
    }
    Pack(fields.data(), n, bits_, p + 4 * nb);
  }

  Status Check(std::string_view bytes, const Shape& shape) const override {
    RETURN_IF_ERROR(Length(bytes, EncodedSize(shape), name()));
    const int64_t n = NumElements(shape), nb = Buckets(n);
    for (int64_t b = 0; b < nb; ++b) {
      RETURN_IF_ERROR(CheckScale(Get<float>(bytes.data() + 4 * b), 1.0f, name() + " norm"));
    }
    const char* p = bytes.data() + 4 * nb;
    const int64_t size = bytes.size() - 4 * nb;
    std::vector<uint8_t> fields(std::min<int64_t>(n, kViewBlock));
    for (int64_t first = 0; first < n; first += kViewBlock) {
      const int64_t len = std::min(kViewBlock, n - first);
      Unpack(p, size, bits_, first, len, fields.data());
      uint8_t max = 0;
      for (int64_t i = 0; i < len; ++i) max = std::max(max, fields[i]);
      if (max > 2 * s_) {
        for (int64_t i = 0; i < len; ++i) {
          if (fields[i] > 2 * s_) {
            return absl::InvalidArgumentError(
                absl::StrCat(name(), " value ", first + i, " has a level beyond ", s_));
          }
        }
      }
    }
    return n == 0 ? absl::OkStatus() : PaddingIsZero(p, n, bits_, size, name());
  }

  void DecodeRange(std::string_view bytes, const Shape& shape, int64_t begin, int64_t count,
                   float* out) const override {
    const int64_t nb = Buckets(NumElements(shape));
    const char* p = bytes.data() + 4 * nb;
    std::vector<uint8_t> fields(count);
    Unpack(p, bytes.size() - 4 * nb, bits_, begin, count, fields.data());
    for (int64_t i = begin; i < begin + count;) {
      const int64_t b = i / kBucket, end = std::min(begin + count, (b + 1) * kBucket);
      kernels::QsgdValues(fields.data() + (i - begin), end - i, Get<float>(bytes.data() + 4 * b),
                          s_, out + (i - begin));
      i = end;
    }
  }

 private:
  const int s_, bits_;
  std::mt19937_64 rng_;
};

const Codec& Float32() {
  static const NoneCodec kNone;
  return kNone;
}

}  // namespace

Status Codec::Decode(std::string_view bytes, const Shape& shape, float* out) const {
  RETURN_IF_ERROR(Check(bytes, shape));
  const int64_t n = NumElements(shape);
  std::vector<float> v(n);
  DecodeRange(bytes, shape, 0, n, v.data());
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) {
      return absl::InvalidArgumentError(absl::StrCat(name(), " value ", i, " decodes to ", v[i]));
    }
  }
  std::copy(v.begin(), v.end(), out);
  return absl::OkStatus();
}

std::string CodecFamily(const std::string& spec) {
  if (spec.empty() || spec == "fp32") return "none";
  return spec.substr(0, spec.find(':'));
}

std::vector<std::string> SupportedCodecFamilies() { return Codecs().Names(); }

std::string EncodeTensors(Codec& codec, const ParameterSet& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& t = values.tensors()[i];
    codec.Encode(static_cast<int>(i), t.values.data(), t.shape, &out);
  }
  return out;
}

int64_t EncodedTensorsSize(const Codec& codec, const ParameterSet& layout) {
  int64_t n = 0;
  for (const auto& t : layout.tensors()) n += codec.EncodedSize(t.shape);
  return n;
}

StatusOr<std::vector<TensorView>> ViewEncodedTensors(const Codec& codec, std::string_view bytes,
                                                     const ParameterSet& layout) {
  if (static_cast<int64_t>(bytes.size()) != EncodedTensorsSize(codec, layout)) {
    return absl::InvalidArgumentError(absl::StrCat(codec.name(), " encoding of ", bytes.size(),
                                                   " bytes, expected ",
                                                   EncodedTensorsSize(codec, layout)));
  }
  std::vector<TensorView> views;
  size_t offset = 0;
  for (const auto& t : layout.tensors()) {
    const int64_t size = codec.EncodedSize(t.shape);
    const std::string_view part = bytes.substr(offset, size);
    if (Status s = codec.Check(part, t.shape); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": ", s.message()));
    }
    TensorView v;
    v.name = t.name;
    v.shape = t.shape;
    v.data = part.data();
    v.numel = t.numel();
    v.decoder = &codec;
    v.encoded_size = size;
    views.push_back(std::move(v));
    offset += size;
  }
  return views;
}

StatusOr<ParameterSet> DecodeTensors(const Codec& codec, std::string_view bytes,
                                     const ParameterSet& layout) {
  ASSIGN_OR_RETURN(std::vector<TensorView> views, ViewEncodedTensors(codec, bytes, layout));
  ParameterSet out = layout.ZerosLike();
  for (size_t i = 0; i < views.size(); ++i) {
    views[i].Read(0, views[i].numel, out.mutable_tensors()[i].values.data());
  }
  RETURN_IF_ERROR(CheckViews(layout, ViewsOf(out)));  // every decoded value finite
  return out;
}

namespace {
constexpr char kCompressedMagic[4] = {'C', 'L', 'V', 'C'};
}

std::string EncodeCompressedSet(Codec& codec, const ParameterSet& values) {
  std::string out(kCompressedMagic, 4);
  Put<uint32_t>(&out, 1);
  const std::string spec = codec.name();
  Put<uint32_t>(&out, spec.size());
  out += spec;
  Put<uint32_t>(&out, values.size());
  for (const auto& t : values.tensors()) {
    Put<uint32_t>(&out, t.name.size());
    out += t.name;
    Put<uint32_t>(&out, t.shape.size());
    for (int64_t d : t.shape) Put<int64_t>(&out, d);
  }
  out += EncodeTensors(codec, values);
  return out;
}

StatusOr<ParameterSet> DecodeCompressedSet(std::string_view bytes, const std::string& expected_spec,
                                           int64_t max_elements) {
  size_t at = 0;
  auto take = [&](size_t n) -> StatusOr<std::string_view> {
    if (bytes.size() - at < n) return absl::InvalidArgumentError("compressed set is truncated");
    std::string_view s = bytes.substr(at, n);
    at += n;
    return s;
  };
  auto u32 = [&]() -> StatusOr<uint32_t> {
    ASSIGN_OR_RETURN(std::string_view s, take(4));
    return Get<uint32_t>(s.data());
  };
  ASSIGN_OR_RETURN(std::string_view magic, take(4));
  if (magic != std::string_view(kCompressedMagic, 4)) {
    return absl::InvalidArgumentError("not a compressed parameter set (bad magic)");
  }
  ASSIGN_OR_RETURN(uint32_t version, u32());
  if (version != 1) return absl::InvalidArgumentError(absl::StrCat("compressed set version ", version));
  ASSIGN_OR_RETURN(uint32_t spec_len, u32());
  if (spec_len > 64) return absl::InvalidArgumentError("compressed set codec name too long");
  ASSIGN_OR_RETURN(std::string_view spec, take(spec_len));
  if (spec != expected_spec) {
    return absl::InvalidArgumentError(absl::StrCat("compressed set encoded with '", std::string(spec),
                                                   "', expected '", expected_spec, "'"));
  }
  ASSIGN_OR_RETURN(auto codec, MakeStatelessCodec(std::string(spec), 0));
  if (!codec) return absl::InvalidArgumentError("a compressed set needs a codec");
  ASSIGN_OR_RETURN(uint32_t count, u32());
  ParameterSet layout;
  int64_t total = 0;
  for (uint32_t i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(uint32_t name_len, u32());
    if (name_len > 4096) return absl::InvalidArgumentError("tensor name too long");
    ASSIGN_OR_RETURN(std::string_view name, take(name_len));
    ASSIGN_OR_RETURN(uint32_t ndim, u32());
    if (ndim > 8) return absl::InvalidArgumentError(absl::StrCat("tensor with ", ndim, " dimensions"));
    Tensor t;
    t.name = std::string(name);
    int64_t numel = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      ASSIGN_OR_RETURN(std::string_view dim, take(8));
      const auto v = Get<int64_t>(dim.data());
      if (v < 0 || (v > 0 && numel > (max_elements - total) / v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", t.name, ": a negative dimension or more than ", max_elements, " values"));
      }
      numel *= v;
      t.shape.push_back(v);
    }
    total += numel;
    t.values.assign(numel, 0.0f);
    RETURN_IF_ERROR(layout.Add(std::move(t)));
  }
  return DecodeTensors(*codec, bytes.substr(at), layout);
}

std::string EncodeValues(Codec* codec, const std::vector<float>& values, const Shape& shape) {
  std::string out;
  NoneCodec float32;
  (codec ? *codec : float32).Encode(0, values.data(), shape, &out);
  return out;
}

StatusOr<std::vector<float>> DecodeValues(const Codec* codec, std::string_view bytes,
                                          const Shape& shape) {
  const Codec& c = codec ? *codec : Float32();
  // Checked before allocating: the shape comes from the same untrusted message.
  RETURN_IF_ERROR(Length(bytes, c.EncodedSize(shape), c.name()));
  std::vector<float> v(NumElements(shape));
  RETURN_IF_ERROR(c.Decode(bytes, shape, v.data()));
  return v;
}

StatusOr<std::unique_ptr<Codec>> MakeStatelessCodec(const std::string& spec, uint64_t seed) {
  if (CodecFamily(spec) == "none") return std::unique_ptr<Codec>();
  ASSIGN_OR_RETURN(auto codec, MakeCodec(spec, seed));
  if (codec->stateful()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec ", spec, " keeps state across calls (error feedback) and cannot encode "
        "something new every call (use fp16, bf16, int8[:channel|:token][:sr], qsgd:S or topk:F:noef)"));
  }
  return codec;
}

StatusOr<double> CodecSpec::Fraction() const {
  double f = 0;
  if (!absl::SimpleAtod(arg, &f) || !(f > 0 && f <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("codec ", spec, ": F must be in (0, 1]"));
  }
  return f;
}

StatusOr<int> CodecSpec::Integer(int lo, int hi) const {
  int v = 0;
  if (!absl::SimpleAtoi(arg, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec ", spec, ": the parameter must be an integer in [", lo, ", ", hi, "]"));
  }
  return v;
}

StatusOr<std::unique_ptr<Codec>> MakeCodec(const std::string& spec, uint64_t seed) {
  const std::string family = CodecFamily(spec);
  const CodecFactory* make = Codecs().Find(family);
  if (make == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown codec '", spec, "'; choose one of ",
                                                   absl::StrJoin(Codecs().Summaries(), ", ")));
  }
  const size_t colon = spec.find(':');
  return (*make)(CodecSpec{spec, colon == std::string::npos ? "" : spec.substr(colon + 1), seed});
}

namespace {

// A codec family without parameters: `spec` must be its name alone.
CodecFactory Exact(std::function<Codec*()> make) {
  return [make](const CodecSpec& s) -> StatusOr<std::unique_ptr<Codec>> {
    if (!s.arg.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("codec ", s.spec, " takes no parameter"));
    }
    return std::unique_ptr<Codec>(make());
  };
}

StatusOr<std::unique_ptr<Codec>> MakeInt8(const CodecSpec& s) {
  const std::string& a = s.arg;
  if (!(a.empty() || a == "sr" || a == "channel" || a == "channel:sr" || a == "token" ||
        a == "token:sr")) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec ", s.spec, ": int8 takes [:channel|:token][:sr]"));
  }
  const auto grouping = absl::StartsWith(a, "channel") ? Int8Codec::Grouping::kRow
                        : absl::StartsWith(a, "token") ? Int8Codec::Grouping::kLastDim
                                                       : Int8Codec::Grouping::kTensor;
  return std::unique_ptr<Codec>(new Int8Codec(s.spec, absl::EndsWith(a, "sr"), grouping, s.seed));
}


}  // namespace

Registry<CodecFactory>& Codecs() {
  static Registry<CodecFactory>* r = [] {
    auto* r = new Registry<CodecFactory>("codec");
    r->AddBuiltin("none", Exact([] { return new NoneCodec(); }));
    r->AddBuiltin("fp16", Exact([] { return new HalfCodec(false); }));
    r->AddBuiltin("bf16", Exact([] { return new HalfCodec(true); }));
    r->AddBuiltin("int8", MakeInt8, "int8[:channel|:token][:sr]");
    r->AddBuiltin(
        "qsgd",
        [](const CodecSpec& s) -> StatusOr<std::unique_ptr<Codec>> {
          ASSIGN_OR_RETURN(int levels, s.Integer(1, 127));
          return std::unique_ptr<Codec>(new QsgdCodec(s.spec, levels, s.seed));
        },
        "qsgd:S");
    r->AddBuiltin("topk", MakeTopK, "topk:F[:ef21|:noef]");
    r->AddBuiltin("randk", MakeRandK, "randk:F");
    r->AddBuiltin("sign", MakeSign);
    r->AddBuiltin("powersgd", MakePowerSgd, "powersgd:R");
    r->AddBuiltin("nf4", MakeNf4, "nf4[:dq]");
    return r;
  }();
  return *r;
}

}  // namespace cleave
