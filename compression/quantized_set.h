// A set of tensors held in a codec's encoding, never decoded whole: a quantized frozen
// base (model.quantize, QLoRA), whose weights stay int8 or NF4 on every holder and are
// dequantized one projection at a time inside the matmul (models/llama.h). The bytes
// are shared, not copied: a model built from a received blob points into it.
//
// Wire encoding (little-endian; docs/protocol.md):
//   "CLVQ" u32 version=1, u32 spec_len, spec (the codec), u32 count, then per tensor:
//   u32 name_len, name, u32 ndim, i64 dims[ndim], u64 byte_len, the codec's encoding.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "compression/codec.h"
#include "core/status.h"

namespace cleave {

struct QuantizedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string_view bytes;                    // the encoding, inside *owner
  std::shared_ptr<const std::string> owner;  // keeps `bytes` alive
};

struct QuantizedSet {
  std::string spec;  // the codec (MakeStatelessCodec)
  std::vector<QuantizedTensor> tensors;

  bool empty() const { return tensors.empty(); }
  const QuantizedTensor* Find(std::string_view name) const;
  // The encoded size of the tensors' bytes, headers aside.
  int64_t payload_bytes() const;

  std::string Encode() const;
  // Parses `bytes` (kept alive by the tensors) and checks every encoding with the codec
  // it names, which must be `expected_spec`; at most `max_elements` values in all.
  // INVALID_ARGUMENT naming what is wrong.
  static StatusOr<QuantizedSet> Parse(std::shared_ptr<const std::string> bytes,
                                      const std::string& expected_spec,
                                      int64_t max_elements = int64_t{1} << 34);
};

// The set's values as float32 (a copy of the whole: for export, not for training).
StatusOr<ParameterSet> DequantizeSet(const QuantizedSet& set);

// `values` (NumElements(shape) floats) encoded by `codec`, as a tensor that owns its bytes.
QuantizedTensor QuantizeTensor(Codec& codec, std::string name, std::vector<int64_t> shape,
                               const float* values);

}  // namespace cleave
