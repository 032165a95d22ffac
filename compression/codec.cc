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
#include "compression/kernels.h"

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

int64_t Rows(const Shape& shape) { return shape.size() >= 2 ? shape[0] : 1; }

Status Length(std::string_view bytes, int64_t expected, const std::string& codec) {
  if (static_cast<int64_t>(bytes.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(codec, " encoding of ", bytes.size(),
                                                   " bytes, expected ", expected));
  }
  return absl::OkStatus();
}

// OK when the `count` float32 values at `p` are finite (`what` names them).
Status FiniteFloats(const char* p, int64_t count, const std::string& what) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(Get<float>(p + 4 * i))) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", i, " is not finite"));
    }
  }
  return absl::OkStatus();
}

// A scale that decodes levels up to `max_level` to finite values.
Status CheckScale(float scale, float max_level, const std::string& codec) {
  if (!std::isfinite(scale) || scale < 0 || !std::isfinite(scale * max_level)) {
    return absl::InvalidArgumentError(
        absl::StrCat(codec, " scale ", scale, " is not a finite number >= 0"));
  }
  return absl::OkStatus();
}

// Little-endian bit fields of `bits` (1..8) bits each.
class BitWriter {
 public:
  BitWriter(std::string* out, int bits) : out_(out), bits_(bits) {}
  void Put(uint32_t field) {
    acc_ |= static_cast<uint64_t>(field) << filled_;
    filled_ += bits_;
    while (filled_ >= 8) {
      out_->push_back(static_cast<char>(acc_ & 0xff));
      acc_ >>= 8;
      filled_ -= 8;
    }
  }
  void Flush() {
    if (filled_ > 0) out_->push_back(static_cast<char>(acc_ & 0xff));
    acc_ = 0;
    filled_ = 0;
  }

 private:
  std::string* out_;
  const int bits_;
  uint64_t acc_ = 0;
  int filled_ = 0;
};

int64_t PackedSize(int64_t n, int bits) { return (n * bits + 7) / 8; }

uint32_t Field(const char* p, int64_t i, int bits, int64_t size) {
  const int64_t bit = i * bits;
  uint32_t word = static_cast<uint8_t>(p[bit / 8]);
  if (bit / 8 + 1 < size) word |= static_cast<uint32_t>(static_cast<uint8_t>(p[bit / 8 + 1])) << 8;
  return (word >> (bit % 8)) & ((1u << bits) - 1);
}

// The unused bits after n fields must be zero: one value has one encoding.
Status PaddingIsZero(const char* p, int64_t n, int bits, int64_t size, const std::string& codec) {
  const int64_t used = n * bits;
  if (used % 8 != 0 && (static_cast<uint8_t>(p[size - 1]) >> (used % 8)) != 0) {
    return absl::InvalidArgumentError(codec + " padding bits are not zero");
  }
  return absl::OkStatus();
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Grows `out` by `n` bytes and returns where they start.
char* Grow(std::string* out, int64_t n) {
  const size_t at = out->size();
  out->resize(at + n);
  return out->data() + at;
}

// A fresh 32-bit seed for one call's stochastic rounding.
uint32_t CallSeed(std::mt19937_64& rng) {
  const uint64_t x = rng();
  return static_cast<uint32_t>(x ^ (x >> 32));
}

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

// Codecs with error feedback: Encode adds the slot's residual to its input first, and
// keeps what the encoding does not carry.
class ErrorFeedbackCodec : public Codec {
 public:
  using Codec::Codec;
  std::vector<float> Residual(int slot) const override {
    auto it = residual_.find(slot);
    return it == residual_.end() ? std::vector<float>() : it->second;
  }
  bool stateful() const override { return true; }

 protected:
  // The slot's residual, n values.
  std::vector<float>& Slot(int slot, int64_t n) {
    std::vector<float>& v = residual_[slot];
    v.resize(n, 0.0f);
    return v;
  }
  // The slot's residual plus `in`: what is owed. The caller leaves in it what stays owed.
  std::vector<float>& Owed(int slot, const float* in, int64_t n) {
    std::vector<float>& v = Slot(slot, n);
    kernels::Add(v.data(), in, n);
    return v;
  }

 private:
  std::map<int, std::vector<float>> residual_;
};

int64_t KOf(double fraction, int64_t n) {
  return n == 0 ? 0 : std::clamp<int64_t>(static_cast<int64_t>(std::ceil(fraction * n)), 1, n);
}

// Adds `in` to `v` (what is owed) and returns the indices of the k values of largest
// magnitude in the sum, increasing. A threshold from a strided sample keeps the
// candidates few; if it keeps fewer than k, all values are candidates.
// `mask` is scratch space.
std::vector<uint32_t> AddAndFindTop(std::vector<float>& v, const float* in, int64_t k,
                                    std::vector<uint8_t>& mask) {
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<uint32_t> idx;
  if (n > (1 << 16) && 8 * k < n) {
    const int64_t m = 1 << 12, stride = n / m;
    std::vector<float> sample(m);
    for (int64_t j = 0; j < m; ++j) sample[j] = std::abs(v[j * stride] + in[j * stride]);
    // Aim for twice k candidates (and at least 64 sampled above the threshold).
    const int64_t want = std::min<int64_t>(m - 1, std::max<int64_t>(64, 2 * k * m / n));
    std::nth_element(sample.begin(), sample.begin() + want, sample.end(), std::greater<float>());
    mask.resize((n + 7) / 8);
    kernels::AddAboveMask(v.data(), in, n, sample[want], mask.data());
    idx.reserve(4 * k);
    for (int64_t b = 0; b < static_cast<int64_t>(mask.size()); ++b) {
      for (uint8_t bits = mask[b]; bits != 0; bits &= bits - 1) {
        idx.push_back(static_cast<uint32_t>(8 * b + __builtin_ctz(bits)));
      }
    }
  } else {
    kernels::Add(v.data(), in, n);
  }
  if (static_cast<int64_t>(idx.size()) < k) {
    idx.resize(n);
    std::iota(idx.begin(), idx.end(), 0u);
  }
  if (k == 0) return {};
  // The k-th largest magnitude among the candidates; then, in index order, every
  // candidate above it and as many equal to it as make k.
  std::vector<float> mags(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) {
    const float m = std::abs(v[idx[j]]);
    mags[j] = m == m ? m : std::numeric_limits<float>::infinity();  // NaN first: it must show
  }
  std::vector<float> order = mags;
  std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), std::greater<float>());
  const float kth = order[k - 1];
  int64_t ties = k;
  for (float m : mags) ties -= m > kth;
  std::vector<uint32_t> top;
  top.reserve(k);
  for (size_t j = 0; j < idx.size(); ++j) {
    if (mags[j] > kth || (mags[j] == kth && ties-- > 0)) top.push_back(idx[j]);
  }
  return top;
}

// Top-k: u32 k, k u32 indices (increasing), k float32 values.
class TopKCodec : public ErrorFeedbackCodec {
 public:
  TopKCodec(std::string name, double fraction, bool ef21)
      : ErrorFeedbackCodec(std::move(name)), fraction_(fraction), ef21_(ef21) {}
  int64_t EncodedSize(const Shape& shape) const override {
    return 4 + 8 * KOf(fraction_, NumElements(shape));
  }

  void Encode(int slot, const float* in, const Shape& shape, std::string* out) override {
    const int64_t n = NumElements(shape), k = KOf(fraction_, n);
    std::vector<float>& v = Slot(slot, n);
    // Classic error feedback: v is the residual, and the top k of residual + in are sent.
    // EF21: v is the estimate h of this client's update that the server tracks too (the
    // sum of all sent so far); the top k of in - h are sent and added to h.
    std::vector<float>* owed = &v;
    if (ef21_) {
      scratch_.resize(n);
      for (int64_t i = 0; i < n; ++i) scratch_[i] = -v[i];
      owed = &scratch_;
    }
    const std::vector<uint32_t> idx = AddAndFindTop(*owed, in, k, mask_);
    char* p = Grow(out, 4 + 8 * k);
    const auto count = static_cast<uint32_t>(k);
    std::memcpy(p, &count, 4);
    std::memcpy(p + 4, idx.data(), 4 * k);
    for (int64_t j = 0; j < k; ++j) {
      const float sent = (*owed)[idx[j]];
      std::memcpy(p + 4 + 4 * k + 4 * j, &sent, 4);
      if (ef21_) {
        v[idx[j]] += sent;
      } else {
        v[idx[j]] = 0.0f;  // sent: nothing of it is owed any more
      }
    }
  }

  Status Check(std::string_view bytes, const Shape& shape) const override {
    const int64_t n = NumElements(shape);
    if (bytes.size() < 4) return absl::InvalidArgumentError(name() + " encoding without a count");
    const int64_t k = Get<uint32_t>(bytes.data());
    if (k > n) return absl::InvalidArgumentError(absl::StrCat(name(), " sends ", k, " of ", n, " values"));
    if (k != KOf(fraction_, n)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name(), " sends ", k, " values, expected ", KOf(fraction_, n)));
    }
    RETURN_IF_ERROR(Length(bytes, 4 + 8 * k, name()));
    const char* p = bytes.data() + 4;
    for (int64_t j = 0; j < k; ++j) {
      const uint32_t i = Get<uint32_t>(p + 4 * j);
      if (i >= n || (j > 0 && i <= Get<uint32_t>(p + 4 * (j - 1)))) {
        return absl::InvalidArgumentError(absl::StrCat(
            name(), " index ", i, " is out of range or not increasing (n = ", n, ")"));
      }
    }
    return FiniteFloats(p + 4 * k, k, name() + " value");
  }

  void DecodeRange(std::string_view bytes, const Shape&, int64_t begin, int64_t count,
                   float* out) const override {
    const int64_t k = Get<uint32_t>(bytes.data());
    const char* idx = bytes.data() + 4;
    const char* values = idx + 4 * k;
    std::fill(out, out + count, 0.0f);
    // The first index >= begin (indices increase).
    int64_t lo = 0, hi = k;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (Get<uint32_t>(idx + 4 * mid) < begin) lo = mid + 1; else hi = mid;
    }
    for (int64_t j = lo; j < k; ++j) {
      const int64_t i = Get<uint32_t>(idx + 4 * j);
      if (i >= begin + count) break;
      out[i - begin] = Get<float>(values + 4 * j);
    }
  }

 private:
  const double fraction_;
  const bool ef21_;
  std::vector<uint8_t> mask_;   // scratch, kept across calls
  std::vector<float> scratch_;  // EF21: in - h
};

// Random-k: u64 seed, then k float32 values, value j at Position(seed, j) in stride j.
class RandKCodec : public ErrorFeedbackCodec {
 public:
  RandKCodec(std::string name, double fraction, uint64_t seed)
      : ErrorFeedbackCodec(std::move(name)), fraction_(fraction), rng_(seed) {}
  int64_t EncodedSize(const Shape& shape) const override {
    return 8 + 4 * KOf(fraction_, NumElements(shape));
  }

  // Stride j is [j n / k, (j + 1) n / k); never empty since k <= n.
  static int64_t Position(uint64_t seed, int64_t j, int64_t n, int64_t k) {
    const int64_t start = j * n / k, len = (j + 1) * n / k - start;
    return start + static_cast<int64_t>(SplitMix64(seed ^ SplitMix64(j)) % len);
  }

  void Encode(int slot, const float* in, const Shape& shape, std::string* out) override {
    const int64_t n = NumElements(shape), k = KOf(fraction_, n);
    std::vector<float>& v = Owed(slot, in, n);
    const uint64_t seed = rng_();
    char* p = Grow(out, 8 + 4 * k);
    std::memcpy(p, &seed, 8);
    for (int64_t j = 0; j < k; ++j) {
      float& x = v[Position(seed, j, n, k)];
      std::memcpy(p + 8 + 4 * j, &x, 4);
      x = 0.0f;
    }
  }

  Status Check(std::string_view bytes, const Shape& shape) const override {
    RETURN_IF_ERROR(Length(bytes, EncodedSize(shape), name()));
    return FiniteFloats(bytes.data() + 8, KOf(fraction_, NumElements(shape)), name() + " value");
  }

  void DecodeRange(std::string_view bytes, const Shape& shape, int64_t begin, int64_t count,
                   float* out) const override {
    const int64_t n = NumElements(shape), k = KOf(fraction_, n);
    const uint64_t seed = Get<uint64_t>(bytes.data());
    std::fill(out, out + count, 0.0f);
    if (count == 0) return;
    // The strides that hold positions begin and begin + count - 1: stride j starts at or
    // before i when j <= ceil((i + 1) k / n) - 1.
    auto stride_of = [&](int64_t i) { return ((i + 1) * k + n - 1) / n - 1; };
    for (int64_t j = stride_of(begin); j <= stride_of(begin + count - 1); ++j) {
      const int64_t i = Position(seed, j, n, k);
      if (i >= begin && i < begin + count) out[i - begin] = Get<float>(bytes.data() + 8 + 4 * j);
    }
  }

 private:
  const double fraction_;
  std::mt19937_64 rng_;
};

// Scaled sign: float32 scale (mean |x| of what is owed), then one bit a value (1 =
// negative), the last byte zero-padded.
class SignCodec : public ErrorFeedbackCodec {
 public:
  SignCodec() : ErrorFeedbackCodec("sign") {}
  int64_t EncodedSize(const Shape& shape) const override {
    return 4 + PackedSize(NumElements(shape), 1);
  }

  void Encode(int slot, const float* in, const Shape& shape, std::string* out) override {
    const int64_t n = NumElements(shape);
    std::vector<float>& v = Owed(slot, in, n);
    const float scale = n == 0 ? 0.0f : static_cast<float>(kernels::SumAbs(v.data(), n) / n);
    char* p = Grow(out, EncodedSize(shape));
    std::memcpy(p, &scale, 4);
    kernels::SignEncode(v.data(), n, scale, reinterpret_cast<uint8_t*>(p + 4));
  }

  Status Check(std::string_view bytes, const Shape& shape) const override {
    RETURN_IF_ERROR(Length(bytes, EncodedSize(shape), name()));
    RETURN_IF_ERROR(CheckScale(Get<float>(bytes.data()), 1.0f, name()));
    const int64_t n = NumElements(shape);
    return n == 0 ? absl::OkStatus() : PaddingIsZero(bytes.data() + 4, n, 1, bytes.size() - 4, name());
  }

  void DecodeRange(std::string_view bytes, const Shape&, int64_t begin, int64_t count,
                   float* out) const override {
    kernels::SignDecode(reinterpret_cast<const uint8_t*>(bytes.data() + 4), begin, count,
                        Get<float>(bytes.data()), out);
  }
};

// PowerSGD: P (rows x r, row-major) then Q^T (r x cols, row-major), float32; the tensor
// is P Q^T. Tensors where that is not smaller than rows x cols are float32.
class PowerSgdCodec : public ErrorFeedbackCodec {
 public:
  PowerSgdCodec(std::string name, int rank, uint64_t seed)
      : ErrorFeedbackCodec(std::move(name)), r_(rank), rng_(seed) {}

  bool LowRank(const Shape& shape) const {
    if (shape.size() < 2) return false;
    const int64_t rows = Rows(shape), cols = NumElements(shape) / std::max<int64_t>(rows, 1);
    return r_ * (rows + cols) < rows * cols;
  }
  int64_t EncodedSize(const Shape& shape) const override {
    if (!LowRank(shape)) return 4 * NumElements(shape);
    return 4 * r_ * (Rows(shape) + NumElements(shape) / Rows(shape));
  }

  void Encode(int slot, const float* in, const Shape& shape, std::string* out) override {
    const int64_t n = NumElements(shape);
    if (!LowRank(shape)) {
      out->append(reinterpret_cast<const char*>(in), 4 * n);
      return;
    }
    const int64_t rows = Rows(shape), cols = n / rows;
    std::vector<float>& m = Owed(slot, in, n);
    std::vector<float>& qt = warm_[slot];  // Q^T, r x cols: the warm start
    if (qt.empty()) qt.assign(r_ * cols, 0.0f);
    std::normal_distribution<float> normal;
    for (int c = 0; c < r_; ++c) {  // a fresh start for columns that collapsed to zero
      float* q = qt.data() + c * cols;
      if (std::all_of(q, q + cols, [](float x) { return x == 0.0f; })) {
        for (int64_t j = 0; j < cols; ++j) q[j] = normal(rng_);
      }
    }
    // P = M Q, columns orthonormalised (Gram-Schmidt, in double); Q^T = P^T M.
    std::vector<double> pd(rows * r_);
    for (int64_t i = 0; i < rows; ++i) {
      for (int c = 0; c < r_; ++c) {
        pd[i * r_ + c] = kernels::Dot(m.data() + i * cols, qt.data() + c * cols, cols);
      }
    }
    for (int c = 0; c < r_; ++c) {
      for (int d = 0; d < c; ++d) {
        double dot = 0;
        for (int64_t i = 0; i < rows; ++i) dot += pd[i * r_ + c] * pd[i * r_ + d];
        for (int64_t i = 0; i < rows; ++i) pd[i * r_ + c] -= dot * pd[i * r_ + d];
      }
      double norm = 0;
      for (int64_t i = 0; i < rows; ++i) norm += pd[i * r_ + c] * pd[i * r_ + c];
      norm = std::sqrt(norm);
      for (int64_t i = 0; i < rows; ++i) pd[i * r_ + c] = norm > 1e-12 ? pd[i * r_ + c] / norm : 0.0;
    }
    std::vector<float> p(pd.begin(), pd.end());
    std::fill(qt.begin(), qt.end(), 0.0f);
    for (int64_t i = 0; i < rows; ++i) {
      for (int c = 0; c < r_; ++c) {
        kernels::Axpy(qt.data() + c * cols, p[i * r_ + c], m.data() + i * cols, cols);
      }
    }
    char* o = Grow(out, EncodedSize(shape));
    std::memcpy(o, p.data(), 4 * p.size());
    std::memcpy(o + 4 * p.size(), qt.data(), 4 * qt.size());
    // What the decoder will compute, exactly (the same kernel): the rest stays owed.
    std::vector<float> sent(cols);
    for (int64_t i = 0; i < rows; ++i) {
      Row(p.data() + i * r_, o + 4 * p.size(), cols, 0, cols, sent.data());
      kernels::Subtract(m.data() + i * cols, sent.data(), cols);
    }
  }

  Status Check(std::string_view bytes, const Shape& shape) const override {
    RETURN_IF_ERROR(Length(bytes, EncodedSize(shape), name()));
    if (kernels::AllFinite(bytes.data(), bytes.size() / 4)) return absl::OkStatus();
    return FiniteFloats(bytes.data(), bytes.size() / 4, name() + " value");
  }

  void DecodeRange(std::string_view bytes, const Shape& shape, int64_t begin, int64_t count,
                   float* out) const override {
    if (!LowRank(shape)) {
      std::memcpy(out, bytes.data() + 4 * begin, 4 * count);
      return;
    }
    const int64_t rows = Rows(shape), cols = NumElements(shape) / rows;
    const char* qt = bytes.data() + 4 * rows * r_;
    float p[64];
    for (int64_t k = begin; k < begin + count;) {
      const int64_t i = k / cols, j0 = k % cols, j1 = std::min(cols, j0 + (begin + count - k));
      std::memcpy(p, bytes.data() + 4 * i * r_, 4 * r_);
      Row(p, qt, cols, j0, j1, out + (k - begin));
      k += j1 - j0;
    }
  }

 private:
  // out[j - j0] = sum_c p[c] Q^T[c][j] for j in [j0, j1).
  void Row(const float* p, const char* qt, int64_t cols, int64_t j0, int64_t j1, float* out) const {
    std::fill(out, out + (j1 - j0), 0.0f);
    for (int c = 0; c < r_; ++c) kernels::AxpyUnaligned(out, p[c], qt + 4 * (c * cols + j0), j1 - j0);
  }

  const int r_;
  std::mt19937_64 rng_;
  std::map<int, std::vector<float>> warm_;  // each slot's last Q^T
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
        "something new every call (use fp16, bf16, int8[:channel|:token][:sr] or qsgd:S)"));
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

StatusOr<std::unique_ptr<Codec>> MakeTopK(const CodecSpec& s) {
  CodecSpec fraction = s;
  const bool ef21 = absl::EndsWith(s.arg, ":ef21");
  if (ef21) fraction.arg.resize(fraction.arg.size() - 5);
  ASSIGN_OR_RETURN(double f, fraction.Fraction());
  return std::unique_ptr<Codec>(new TopKCodec(s.spec, f, ef21));
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
    r->AddBuiltin("topk", MakeTopK, "topk:F[:ef21]");
    r->AddBuiltin(
        "randk",
        [](const CodecSpec& s) -> StatusOr<std::unique_ptr<Codec>> {
          ASSIGN_OR_RETURN(double f, s.Fraction());
          return std::unique_ptr<Codec>(new RandKCodec(s.spec, f, s.seed));
        },
        "randk:F");
    r->AddBuiltin("sign", Exact([] { return new SignCodec(); }));
    r->AddBuiltin(
        "powersgd",
        [](const CodecSpec& s) -> StatusOr<std::unique_ptr<Codec>> {
          ASSIGN_OR_RETURN(int rank, s.Integer(1, 64));
          return std::unique_ptr<Codec>(new PowerSgdCodec(s.spec, rank, s.seed));
        },
        "powersgd:R");
    return r;
  }();
  return *r;
}

}  // namespace cleave
