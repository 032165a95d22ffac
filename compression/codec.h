// Codecs: a float span to bytes and back, for updates, model broadcasts and split-learning
// activations and gradients (issue 4; not yet wired into the wire or the server).
//
// Spec strings (MakeCodec):
//   none        float32 as is (4 bytes a value)
//   fp16        IEEE half precision, round to nearest even (2 bytes)
//   bf16        bfloat16, round to nearest even (2 bytes)
//   int8        one float32 scale (max |x| / 127) and a signed byte per value, rounded to
//               nearest: error at most half a step (scale / 2)
//   int8:sr     the same with stochastic rounding: unbiased, error under one step
//   topk:F      the ceil(F * n) values of largest magnitude (0 < F <= 1) as (index, value)
//               pairs, with error feedback: what is not sent is kept in a residual and
//               added to the next call for the same slot
//
// Encode keeps per-slot state (the residual) for codecs that need it: a slot is one
// tensor of one client. Decode is stateless and checks everything: a malformed encoding
// is INVALID_ARGUMENT and `out` is left untouched.
// Not thread-safe: one Codec per client and direction.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/parameter_set.h"
#include "core/status.h"

namespace cleave {

class Codec {
 public:
  virtual ~Codec() = default;
  virtual std::string name() const = 0;

  // Appends the encoding of in[0, n) to `out`.
  virtual void Encode(int slot, const float* in, int64_t n, std::string* out) = 0;
  // Decodes `bytes`, which must be exactly one encoding of n values, into out[0, n).
  virtual Status Decode(std::string_view bytes, int64_t n, float* out) const = 0;
  // The exact size of an encoding of n values.
  virtual int64_t EncodedSize(int64_t n) const = 0;

  // The residual of `slot` (error feedback); empty for codecs without one.
  virtual std::vector<float> Residual(int slot) const { return {}; }
};

// The codec `spec` names (see above); `seed` drives stochastic rounding.
StatusOr<std::unique_ptr<Codec>> MakeCodec(const std::string& spec, uint64_t seed = 0);

// The codec family a spec belongs to ("topk:0.01" -> "topk"; "", "fp32" -> "none"), as
// clients advertise them.
std::string CodecFamily(const std::string& spec);
// The families this build supports.
std::vector<std::string> SupportedCodecFamilies();

// An update (or any parameter set) compressed tensor by tensor: the concatenated
// encodings of `values`' tensors, in order; slot i is tensor i.
std::string EncodeTensors(Codec& codec, const ParameterSet& values);
// Its exact size for tensors of `layout`'s shapes.
int64_t EncodedTensorsSize(const Codec& codec, const ParameterSet& layout);
// Decodes EncodeTensors' output into a set with `layout`'s names and shapes. Any
// malformed part is INVALID_ARGUMENT naming the tensor.
StatusOr<ParameterSet> DecodeTensors(const Codec& codec, std::string_view bytes,
                                     const ParameterSet& layout);

// One tensor's values as `codec` encodes them (nullptr: raw float32), and back. Decode
// checks the length (`n` values) and, through the codec, everything else.
std::string EncodeValues(Codec* codec, const std::vector<float>& values);
StatusOr<std::vector<float>> DecodeValues(const Codec* codec, std::string_view bytes, int64_t n);

// A codec for split activations or gradients: a new batch every call, so no codec that
// keeps state across calls (top-k). nullptr for "none".
StatusOr<std::unique_ptr<Codec>> MakeStatelessCodec(const std::string& spec, uint64_t seed);

// IEEE half and bfloat16 conversions (round to nearest even), exposed for tests.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);

}  // namespace cleave
