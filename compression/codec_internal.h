// Internal to compression/: the byte and bit helpers every codec's encoding uses, and
// the factories of the codecs in their own files (sparse_codecs.cc: topk, randk, sign,
// powersgd), which codec.cc registers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"

namespace cleave {
namespace codec_internal {

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

inline int64_t Rows(const Shape& shape) { return shape.size() >= 2 ? shape[0] : 1; }

inline Status Length(std::string_view bytes, int64_t expected, const std::string& codec) {
  if (static_cast<int64_t>(bytes.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(codec, " encoding of ", bytes.size(),
                                                   " bytes, expected ", expected));
  }
  return absl::OkStatus();
}

// OK when the `count` float32 values at `p` are finite (`what` names them).
inline Status FiniteFloats(const char* p, int64_t count, const std::string& what) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(Get<float>(p + 4 * i))) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", i, " is not finite"));
    }
  }
  return absl::OkStatus();
}

// A scale that decodes levels up to `max_level` to finite values.
inline Status CheckScale(float scale, float max_level, const std::string& codec) {
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

inline int64_t PackedSize(int64_t n, int bits) { return (n * bits + 7) / 8; }

inline uint32_t Field(const char* p, int64_t i, int bits, int64_t size) {
  const int64_t bit = i * bits;
  uint32_t word = static_cast<uint8_t>(p[bit / 8]);
  if (bit / 8 + 1 < size) word |= static_cast<uint32_t>(static_cast<uint8_t>(p[bit / 8 + 1])) << 8;
  return (word >> (bit % 8)) & ((1u << bits) - 1);
}

// The unused bits after n fields must be zero: one value has one encoding.
inline Status PaddingIsZero(const char* p, int64_t n, int bits, int64_t size, const std::string& codec) {
  const int64_t used = n * bits;
  if (used % 8 != 0 && (static_cast<uint8_t>(p[size - 1]) >> (used % 8)) != 0) {
    return absl::InvalidArgumentError(codec + " padding bits are not zero");
  }
  return absl::OkStatus();
}

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Grows `out` by `n` bytes and returns where they start.
inline char* Grow(std::string* out, int64_t n) {
  const size_t at = out->size();
  out->resize(at + n);
  return out->data() + at;
}

// A fresh 32-bit seed for one call's stochastic rounding.
inline uint32_t CallSeed(std::mt19937_64& rng) {
  const uint64_t x = rng();
  return static_cast<uint32_t>(x ^ (x >> 32));
}

// The sparse and low-rank families (sparse_codecs.cc): topk:F[:ef21|:noef], randk:F, sign,
// powersgd:R.
StatusOr<std::unique_ptr<Codec>> MakeTopK(const CodecSpec& s);
StatusOr<std::unique_ptr<Codec>> MakeRandK(const CodecSpec& s);
StatusOr<std::unique_ptr<Codec>> MakeSign(const CodecSpec& s);
StatusOr<std::unique_ptr<Codec>> MakePowerSgd(const CodecSpec& s);
StatusOr<std::unique_ptr<Codec>> MakeNf4(const CodecSpec& s);  // nf4_codec.cc

}  // namespace codec_internal
}  // namespace cleave
