#include "compression/kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

#include "compression/codec.h"

namespace cleave::kernels {

// x86-64: each loop also compiled for x86-64-v3 (AVX2), chosen at load time, and fp16
// conversion with F16C where the CPU has it. Elsewhere (arm64 edge devices) the portable
// loops, which the compiler vectorizes for the target's baseline (NEON on arm64).
#if defined(__x86_64__)
#define CLEAVE_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))

namespace {
// F16C from CPUID (clang's __builtin_cpu_supports does not know "f16c"); AVX also
// through the builtin, which checks that the OS saves the YMM registers.
bool HasF16c() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  return (c & bit_F16C) && (c & bit_AVX) && __builtin_cpu_supports("avx");
}
const bool kF16c = HasF16c();
}
#else
#define CLEAVE_CLONES
#endif

CLEAVE_CLONES bool AllFinite(const char* p, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w;
    std::memcpy(&w, p + 4 * i, 4);
    bad |= (w & 0x7f800000u) == 0x7f800000u;
  }
  return bad == 0;
}

CLEAVE_CLONES bool NoneMasked16(const char* p, int64_t n, uint16_t mask) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    bad |= (h & mask) == mask;
  }
  return bad == 0;
}

CLEAVE_CLONES float MaxAbs(const float* x, int64_t n) {
  // On |x|'s bits, integer order is float order, and a NaN is above every number.
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w;
    std::memcpy(&w, x + i, 4);
    w &= 0x7fffffffu;
    m = w > m ? w : m;
  }
  float f;
  std::memcpy(&f, &m, 4);
  return f;
}

CLEAVE_CLONES void Add(float* acc, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

#if defined(__x86_64__)
namespace {

__attribute__((target("avx,f16c"))) void ToHalfF16c(const float* x, int64_t n, char* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  for (; i < n; ++i) {
    const uint16_t h = FloatToHalf(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

__attribute__((target("avx,f16c"))) void FromHalfF16c(const char* in, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = HalfToFloat(h);
  }
}

}  // namespace
#endif

void ToHalf(const float* x, int64_t n, char* out) {
#if defined(__x86_64__)
  if (kF16c) return ToHalfF16c(x, n, out);
#endif
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = FloatToHalf(x[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

void FromHalf(const char* in, int64_t n, float* out) {
#if defined(__x86_64__)
  if (kF16c) return FromHalfF16c(in, n, out);
#endif
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = HalfToFloat(h);
  }
}

CLEAVE_CLONES void ToBf16(const float* x, int64_t n, char* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w;
    std::memcpy(&w, x + i, 4);
    const bool nan = (w & 0x7fffffffu) > 0x7f800000u;
    const uint16_t b = static_cast<uint16_t>(nan ? (w >> 16) | 0x40 : (w + 0x7fffu + ((w >> 16) & 1)) >> 16);
    std::memcpy(out + 2 * i, &b, 2);
  }
}

CLEAVE_CLONES void FromBf16(const char* in, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, in + 2 * i, 2);
    const uint32_t w = static_cast<uint32_t>(b) << 16;
    std::memcpy(out + i, &w, 4);
  }
}

CLEAVE_CLONES void QuantizeNearest(const float* x, int64_t n, float scale, int8_t* q) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = scale > 0 ? std::nearbyint(x[i] / scale) : 0.0f;
    q[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, v)));
  }
}

CLEAVE_CLONES void QuantizeStochastic(const float* x, int64_t n, float scale, uint32_t seed,
                                      int8_t* q) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = scale > 0 ? std::floor(x[i] / scale + Uniform(seed, static_cast<uint32_t>(i)))
                              : 0.0f;
    q[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, v)));
  }
}

CLEAVE_CLONES void Dequantize(const int8_t* q, int64_t n, float scale, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = scale * static_cast<float>(q[i]);
}

CLEAVE_CLONES bool AnyMinus128(const int8_t* q, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= q[i] == -128;
  return bad != 0;
}

CLEAVE_CLONES double SumAbs(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::fabs(static_cast<double>(x[i]));
  return s;
}

CLEAVE_CLONES double SumSquares(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

CLEAVE_CLONES void SignEncode(float* x, int64_t n, float scale, uint8_t* bits) {
  const int64_t whole = n / 8;
  for (int64_t b = 0; b < whole; ++b) {
    uint8_t byte = 0;
    for (int j = 0; j < 8; ++j) byte |= static_cast<uint8_t>(x[8 * b + j] < 0) << j;
    bits[b] = byte;
  }
  if (n % 8) {
    uint8_t byte = 0;
    for (int64_t i = 8 * whole; i < n; ++i) byte |= static_cast<uint8_t>(x[i] < 0) << (i % 8);
    bits[whole] = byte;
  }
  for (int64_t i = 0; i < n; ++i) x[i] -= x[i] < 0 ? -scale : scale;
}

CLEAVE_CLONES void SignDecode(const uint8_t* bits, int64_t first, int64_t n, float scale,
                              float* out) {
  uint32_t s;
  std::memcpy(&s, &scale, 4);
  auto put = [&](int64_t i, uint32_t bit) {
    const uint32_t w = s | bit << 31;  // the sign bit set for a negative value
    std::memcpy(out + i, &w, 4);
  };
  int64_t i = 0;
  for (; i < n && (first + i) % 8 != 0; ++i) put(i, (bits[(first + i) >> 3] >> ((first + i) & 7)) & 1);
  for (; i + 8 <= n; i += 8) {
    const uint32_t byte = bits[(first + i) >> 3];
    for (int j = 0; j < 8; ++j) {
      const uint32_t w = s | ((byte >> j) & 1) << 31;
      std::memcpy(out + i + j, &w, 4);
    }
  }
  for (; i < n; ++i) put(i, (bits[(first + i) >> 3] >> ((first + i) & 7)) & 1);
}

CLEAVE_CLONES void AddAboveMask(float* v, const float* x, int64_t n, float t, uint8_t* mask) {
  for (int64_t b = 0; b < n / 8; ++b) {
    uint8_t m = 0;
    for (int j = 0; j < 8; ++j) {
      v[8 * b + j] += x[8 * b + j];
      m |= static_cast<uint8_t>(std::fabs(v[8 * b + j]) >= t) << j;
    }
    mask[b] = m;
  }
  if (n % 8) {
    uint8_t m = 0;
    for (int64_t i = n / 8 * 8; i < n; ++i) {
      v[i] += x[i];
      m |= static_cast<uint8_t>(std::fabs(v[i]) >= t) << (i % 8);
    }
    mask[n / 8] = m;
  }
}

CLEAVE_CLONES void QsgdFields(const float* x, int64_t n, float norm, int s, uint32_t seed,
                              uint32_t first, uint8_t* fields) {
  const float fs = static_cast<float>(s);
  const float k = norm > 0 ? fs / norm : 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float p = std::min(fs, std::fabs(x[i]) * k);
    float level = std::floor(p);
    level += (Uniform(seed, first + static_cast<uint32_t>(i)) < p - level) ? 1.0f : 0.0f;
    level = std::min(level, fs);
    fields[i] = static_cast<uint8_t>(static_cast<int>(x[i] < 0 ? -level : level) + s);
  }
}

CLEAVE_CLONES void QsgdValues(const uint8_t* fields, int64_t n, float norm, int s, float* out) {
  const float step = norm / static_cast<float>(s);
  for (int64_t i = 0; i < n; ++i) out[i] = step * static_cast<float>(fields[i] - s);
}

CLEAVE_CLONES float Dot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

CLEAVE_CLONES void Axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

CLEAVE_CLONES void AxpyUnaligned(float* y, float a, const char* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v;
    std::memcpy(&v, x + 4 * i, 4);
    y[i] += a * v;
  }
}

CLEAVE_CLONES void Subtract(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] -= x[i];
}

}  // namespace cleave::kernels
