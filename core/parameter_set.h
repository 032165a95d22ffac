// ParameterSet: an ordered list of named float32 tensors. The unit that travels on the
// wire, is aggregated and is checkpointed. No LibTorch here; models/ converts.
//
// Wire encoding (little-endian), see docs/protocol.md:
//   "CLVP" u32 version=1, u32 count, then per tensor:
//   u32 name_len, name bytes, u8 dtype (1 = float32), u32 ndim, i64 dims[ndim],
//   u64 byte_len, raw data.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace cleave {

enum class DType : uint8_t { kFloat32 = 1 };

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major, numel(shape) elements

  int64_t numel() const;
};

// Product of dims; 1 for a scalar (empty shape).
int64_t NumElements(const std::vector<int64_t>& shape);

class ParameterSet {
 public:
  ParameterSet() = default;

  // Appends a tensor. Names must be unique; values.size() must equal numel(shape).
  Status Add(Tensor t);

  const std::vector<Tensor>& tensors() const { return tensors_; }
  std::vector<Tensor>& mutable_tensors() { return tensors_; }
  size_t size() const { return tensors_.size(); }
  int64_t total_elements() const;
  // Returns nullptr when absent.
  const Tensor* Find(std::string_view name) const;

  // True when both have the same names, order and shapes.
  bool SameLayout(const ParameterSet& other) const;
  // A zero-filled set with this one's layout.
  ParameterSet ZerosLike() const;

  // Encodes into the wire format above.
  std::string Encode() const;
  // Exact size Encode() will produce, without encoding.
  size_t EncodedSize() const;

  // Decodes and checks structure: magic, version, dtype, byte counts consistent with
  // shapes, no trailing bytes, no duplicate names, at most `max_elements` in total.
  // Values are not checked for finiteness (see AllFinite).
  static StatusOr<ParameterSet> Decode(std::string_view bytes,
                                       int64_t max_elements = int64_t{1} << 31);

  // OK when `other` has exactly this set's layout; otherwise INVALID_ARGUMENT that
  // says what differs.
  Status CheckSameLayout(const ParameterSet& other) const;

 private:
  std::vector<Tensor> tensors_;
};

// Decodes ranges of one tensor's compressed encoding (a compression codec), so that
// compressed updates are read block by block like fp32 ones, never decoded whole.
class RangeDecoder {
 public:
  virtual ~RangeDecoder() = default;
  // Values [begin, begin + count) of a tensor of `shape` whose encoding `bytes` has
  // already been checked.
  virtual void DecodeRange(std::string_view bytes, const std::vector<int64_t>& shape,
                           int64_t begin, int64_t count, float* out) const = 0;
};

// A read-only view of one encoded tensor: `data` points into the encoded bytes
// (possibly unaligned; read with Read()). Raw float32 values unless `decoder` is set,
// in which case data[0, encoded_size) is a checked encoding that `decoder` reads.
struct TensorView {
  std::string_view name;
  std::vector<int64_t> shape;
  const char* data = nullptr;
  int64_t numel = 0;
  const RangeDecoder* decoder = nullptr;
  int64_t encoded_size = 0;
  // Read multiplies each value by it (an asynchronous update's staleness factor).
  float scale = 1.0f;

  // Copies values [begin, begin + count), times scale, to `out` (aligned, unlike `data`).
  void Read(int64_t begin, int64_t count, float* out) const;
};

// Values are processed in blocks of this many floats, copied to an aligned buffer.
constexpr int64_t kViewBlock = 2048;

// Parses the structure of an encoded parameter set without copying its values, with
// the same checks as ParameterSet::Decode. The views live as long as `bytes`.
StatusOr<std::vector<TensorView>> ParseParameterSet(std::string_view bytes,
                                                    int64_t max_elements = int64_t{1} << 31);

// OK when `views` have exactly `layout`'s names, order and shapes and every value is
// finite with magnitude <= max_abs; otherwise INVALID_ARGUMENT saying what is wrong.
Status CheckViews(const ParameterSet& layout, const std::vector<TensorView>& views,
                  float max_abs = std::numeric_limits<float>::max());

// Views of `set`'s tensors (valid while `set` lives and is not changed).
std::vector<TensorView> ViewsOf(const ParameterSet& set);

// Personal layers (FedPer / FedBN) select tensors by name.
// The names of `set`'s tensors that match one of `patterns` (shell globs, fnmatch(3):
// `head.*`, `*.running_*`), in `set`'s order. INVALID_ARGUMENT when a pattern matches
// nothing, listing the names there are.
StatusOr<std::vector<std::string>> MatchTensorNames(const ParameterSet& set,
                                                    const std::vector<std::string>& patterns);
// `set` with (Only) or without (Without) the tensors named in `names`, order kept.
ParameterSet Only(const ParameterSet& set, const std::vector<std::string>& names);
ParameterSet Without(const ParameterSet& set, const std::vector<std::string>& names);
// Copies each tensor of `part` over the tensor of the same name in `set`.
// INVALID_ARGUMENT (and `set` unchanged) when one is absent or shaped differently.
Status Overwrite(const ParameterSet& part, ParameterSet* set);

// Hex SHA-256 of `bytes`: the content address of a blob.
std::string Sha256Hex(std::string_view bytes);
// Sha256Hex of the encoding (ParameterSet::Encode) of a set of `views`' values, computed
// as it goes: no encoding is ever whole in memory. Views of float32 values only (no
// decoder, scale 1), as ViewsOf makes them.
std::string EncodedSha256Hex(const std::vector<TensorView>& views);

}  // namespace cleave
