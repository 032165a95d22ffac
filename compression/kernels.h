// The loops codecs spend their time in, vectorised for the CPU they run on (each is
// compiled for x86-64-v3, AVX2 + FMA + F16C, and for the baseline, and picked at load
// time). Internal to compression/.
#pragma once

#include <cstdint>

namespace cleave::kernels {

// True when the `n` float32 values at `p` (any alignment) are all finite.
bool AllFinite(const char* p, int64_t n);
// True when no uint16 at `p` has all of `mask`'s bits set (an fp16 or bf16 Inf or NaN).
bool NoneMasked16(const char* p, int64_t n, uint16_t mask);
// max |x|.
float MaxAbs(const float* x, int64_t n);
// acc[i] += x[i].
void Add(float* acc, const float* x, int64_t n);

// IEEE half and bfloat16, round to nearest even; `out` may be unaligned.
void ToHalf(const float* x, int64_t n, char* out);
void FromHalf(const char* in, int64_t n, float* out);
void ToBf16(const float* x, int64_t n, char* out);
void FromBf16(const char* in, int64_t n, float* out);

// int8: q = clamp(round(x / scale), -127, 127), round to nearest even, or stochastically
// (floor(x / scale + u), u uniform in [0, 1) from Uniform(seed, i)); scale 0 gives 0.
void QuantizeNearest(const float* x, int64_t n, float scale, int8_t* q);
void QuantizeStochastic(const float* x, int64_t n, float scale, uint32_t seed, int8_t* q);
void Dequantize(const int8_t* q, int64_t n, float scale, float* out);
// True when some byte is -128.
bool AnyMinus128(const int8_t* q, int64_t n);

// A uniform float in [0, 1) from a 32-bit hash of (seed, i): cheap, vectorisable,
// statistically sound for rounding (not for cryptography).
inline float Uniform(uint32_t seed, uint32_t i) {
  uint32_t x = i * 0x9e3779b9u + seed;
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

// Sum of |x| and of x^2, in double.
double SumAbs(const float* x, int64_t n);
double SumSquares(const float* x, int64_t n);

// Scaled sign: bit i of `bits` (LSB first) is x[i] < 0, the last byte zero-padded; then
// x[i] -= (x[i] < 0 ? -scale : scale), what stays owed.
void SignEncode(float* x, int64_t n, float scale, uint8_t* bits);
// out[i] = bit (first + i) ? -scale : scale.
void SignDecode(const uint8_t* bits, int64_t first, int64_t n, float scale, float* out);

// v[i] += x[i]; then bit i of `mask` (LSB first, ceil(n / 8) bytes) is |v[i]| >= t.
void AddAboveMask(float* v, const float* x, int64_t n, float t, uint8_t* mask);

// QSGD fields (level + s, in 0..2s) of x against `norm`, levels stochastically rounded.
void QsgdFields(const float* x, int64_t n, float norm, int s, uint32_t seed, uint32_t first,
                uint8_t* fields);
// out[i] = norm * (fields[i] - s) / s.
void QsgdValues(const uint8_t* fields, int64_t n, float norm, int s, float* out);

// Dense linear algebra for PowerSGD: a . b; y += a x; y += a x with x unaligned; y -= x.
float Dot(const float* a, const float* b, int64_t n);
void Axpy(float* y, float a, const float* x, int64_t n);
void AxpyUnaligned(float* y, float a, const char* x, int64_t n);
void Subtract(float* y, const float* x, int64_t n);

}  // namespace cleave::kernels
