// Codecs: a float tensor to bytes and back, for updates (compression.update), model
// broadcasts (compression.broadcast) and split-learning activations and gradients.
//
// Spec strings (MakeCodec); "rows" is a tensor's first dimension (a weight's output
// channels), "cols" the product of the others:
//   none            float32 as is (4 bytes a value)
//   fp16            IEEE half precision, round to nearest even (2 bytes)
//   bf16            bfloat16, round to nearest even (2 bytes)
//   int8            a float32 scale (max |x| / 127) and a signed byte per value, rounded
//                   to nearest: error at most half a step (scale / 2)
//   int8:sr         the same with stochastic rounding: unbiased, error under one step
//   int8:channel    one scale per row (tensors of 2+ dimensions; 1-D tensors get one)
//   int8:channel:sr per-row scales and stochastic rounding
//   int8:token      one scale per vector along the last dimension (each token of
//                   [batch, tokens, dim] activations), as bfloat16 rounded up: error at
//                   most half of that token's step; 1-D tensors get one
//   int8:token:sr   per-token scales and stochastic rounding
//   qsgd:S          QSGD with S levels (1..127): per bucket of 512 values a float32 L2
//                   norm, and per value a sign and a level in 0..S, stochastically
//                   rounded (unbiased), packed in ceil(log2(2S + 1)) bits
//   topk:F          the ceil(F * n) values of largest magnitude (0 < F <= 1) as (index,
//                   value) pairs, with error feedback
//   topk:F:noef     the same encoding without error feedback: stateless (activations
//                   and gradients at a cut), what is not sent is lost
//   topk:F:ef21     the same encoding with EF21's feedback (Richtarik et al. 2021): the
//                   slot holds h, the sum of all sent, and the top k of (in - h) are
//                   sent, so each upload is an increment of h; the server keeps the
//                   mean of the clients' h and applies it every round (CreateStrategy)
//   randk:F         as many values, one at a random position in each of k equal strides
//                   of the tensor; only the positions' u64 seed travels. Error feedback
//   sign            scaled sign (EF-signSGD): one float32 scale (mean |x|) and one bit a
//                   value, with error feedback
//   powersgd:R      PowerSGD rank R (1..64): one power iteration on the rows x cols
//                   matrix, warm-started from the previous call's Q, sends P (rows x R,
//                   orthonormal columns) and Q (cols x R); error feedback. Tensors where
//                   rank R would not save bytes (1-D, small) are sent as float32
//   nf4[:dq]        4-bit NormalFloat (QLoRA): per block of 64 values a float32 absmax
//                   and per value the nearest of NF4's 16 codes (nf4_codec.cc); :dq
//                   quantizes the absmax values to int8 in groups of 256 (the frozen
//                   bases of model.quantize: nf4)
//
// With error feedback the codec keeps a residual per slot (one tensor of one client):
// what was not sent is added to the next call's input, so nothing is lost, only delayed.
// Decoding is stateless and checks everything first: a malformed encoding is
// INVALID_ARGUMENT and nothing is written. Not thread-safe: one Codec per client and
// direction (encoding); decoding methods are const and may run concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/parameter_set.h"
#include "core/registry.h"
#include "core/status.h"

namespace cleave {

using Shape = std::vector<int64_t>;

class Codec : public RangeDecoder {
 public:
  std::string name() const { return name_; }

  // Appends the encoding of in[0, NumElements(shape)) to `out`.
  virtual void Encode(int slot, const float* in, const Shape& shape, std::string* out) = 0;
  // The exact size of an encoding of a tensor of `shape`.
  virtual int64_t EncodedSize(const Shape& shape) const = 0;
  // OK when `bytes` is exactly one well-formed encoding of a tensor of `shape`.
  virtual Status Check(std::string_view bytes, const Shape& shape) const = 0;
  // Values [begin, begin + count) of an encoding that passed Check.
  void DecodeRange(std::string_view bytes, const Shape& shape, int64_t begin, int64_t count,
                   float* out) const override = 0;

  // Check, then all values into out[0, n), which must all be finite. On error `out` is
  // untouched.
  Status Decode(std::string_view bytes, const Shape& shape, float* out) const;

  // The residual of `slot` (error feedback; for topk:F:ef21 the estimate h); empty for
  // codecs without one.
  virtual std::vector<float> Residual(int slot) const { return {}; }
  // True when Encode keeps state across calls (a residual or a warm start).
  virtual bool stateful() const { return false; }

 protected:
  explicit Codec(std::string name) : name_(std::move(name)) {}

 private:
  const std::string name_;
};

// The codec `spec` names (see above), built by its family's entry in Codecs(); `seed`
// drives its randomness (stochastic rounding, random positions, PowerSGD's first Q).
// INVALID_ARGUMENT "unknown codec 'x'; choose one of ..." for a family nobody
// registered, or the family's own error for bad parameters.
StatusOr<std::unique_ptr<Codec>> MakeCodec(const std::string& spec, uint64_t seed = 0);

// The codec family a spec belongs to: the part before the first ':' ("topk:0.01" ->
// "topk"; "", "fp32" -> "none"), as clients advertise them.
std::string CodecFamily(const std::string& spec);
// The families this build supports: Codecs()' names.
std::vector<std::string> SupportedCodecFamilies();

// What a codec family's factory is given: the whole spec ("topk:0.01:ef21"), what
// follows the family's colon ("0.01:ef21"; empty when nothing does) and the seed.
struct CodecSpec {
  std::string spec;
  std::string arg;
  uint64_t seed = 0;
  // `arg` as F in (0, 1], or INVALID_ARGUMENT naming the spec.
  StatusOr<double> Fraction() const;
  // `arg` as an integer in [lo, hi], or INVALID_ARGUMENT naming the spec.
  StatusOr<int> Integer(int lo, int hi) const;
};
using CodecFactory = std::function<StatusOr<std::unique_ptr<Codec>>(const CodecSpec&)>;

// Codec families by name, with how each spec is written ("topk:F[:ef21]") as the
// summary. The built-ins are registered in codec.cc; a codec of one's own is its own
// file plus one Add (tests/integration/registration_test.cc). Clients advertise every
// registered family in their Join.
Registry<CodecFactory>& Codecs();

// A parameter set compressed tensor by tensor: the concatenated encodings of `values`'
// tensors, in order; slot i is tensor i.
std::string EncodeTensors(Codec& codec, const ParameterSet& values);
// Its exact size for tensors of `layout`'s shapes.
int64_t EncodedTensorsSize(const Codec& codec, const ParameterSet& layout);
// Checks every tensor's encoding in EncodeTensors' output and returns views that decode
// block by block (valid while `bytes`, `codec` and `layout` live). Any malformed part is
// INVALID_ARGUMENT naming the tensor.
StatusOr<std::vector<TensorView>> ViewEncodedTensors(const Codec& codec, std::string_view bytes,
                                                     const ParameterSet& layout);
// The same, decoded into a set with `layout`'s names and shapes; values must be finite.
StatusOr<ParameterSet> DecodeTensors(const Codec& codec, std::string_view bytes,
                                     const ParameterSet& layout);

// A compressed model broadcast, self-describing (docs/protocol.md):
//   "CLVC" u32 version=1, u32 spec_len, spec, u32 count, per tensor: u32 name_len, name,
//   u32 ndim, i64 dims[ndim]; then EncodeTensors' output.
std::string EncodeCompressedSet(Codec& codec, const ParameterSet& values);
// Decodes it with the codec it names, which must be `expected_spec`; at most
// `max_elements` values in total; every value must be finite.
StatusOr<ParameterSet> DecodeCompressedSet(std::string_view bytes, const std::string& expected_spec,
                                           int64_t max_elements);

// One tensor's values as `codec` encodes them (nullptr: raw float32), and back. Decode
// checks the length against the shape before allocating and, through the codec,
// everything else.
std::string EncodeValues(Codec* codec, const std::vector<float>& values, const Shape& shape);
StatusOr<std::vector<float>> DecodeValues(const Codec* codec, std::string_view bytes,
                                          const Shape& shape);

// A codec for what changes completely every call (split activations and gradients, a
// model broadcast shared by all clients): no codec that keeps state across calls (topk,
// randk, sign, powersgd). nullptr for "none".
StatusOr<std::unique_ptr<Codec>> MakeStatelessCodec(const std::string& spec, uint64_t seed);

// IEEE half and bfloat16 conversions (round to nearest even), exposed for tests.
uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);

}  // namespace cleave
