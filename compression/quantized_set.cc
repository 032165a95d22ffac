#include "compression/quantized_set.h"

#include <cstring>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "core/printable.h"
#include "core/byte_reader.h"

namespace cleave {
namespace {

constexpr char kMagic[4] = {'C', 'L', 'V', 'Q'};
constexpr uint32_t kVersion = 1;

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}


Status Truncated(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat("quantized set truncated in ", what));
}

}  // namespace

const QuantizedTensor* QuantizedSet::Find(std::string_view name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

int64_t QuantizedSet::payload_bytes() const {
  int64_t n = 0;
  for (const auto& t : tensors) n += static_cast<int64_t>(t.bytes.size());
  return n;
}

std::string QuantizedSet::Encode() const {
  std::string out(kMagic, 4);
  Put<uint32_t>(out, kVersion);
  Put<uint32_t>(out, static_cast<uint32_t>(spec.size()));
  out += spec;
  Put<uint32_t>(out, static_cast<uint32_t>(tensors.size()));
  for (const auto& t : tensors) {
    Put<uint32_t>(out, static_cast<uint32_t>(t.name.size()));
    out += t.name;
    Put<uint32_t>(out, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) Put<int64_t>(out, d);
    Put<uint64_t>(out, t.bytes.size());
    out.append(t.bytes.data(), t.bytes.size());
  }
  return out;
}

StatusOr<QuantizedSet> QuantizedSet::Parse(std::shared_ptr<const std::string> bytes,
                                           const std::string& expected_spec,
                                           int64_t max_elements) {
  ByteReader r(*bytes);
  std::string_view magic, spec;
  if (!r.GetBytes(4, &magic)) return Truncated("magic");
  if (std::memcmp(magic.data(), kMagic, 4) != 0) {
    return absl::InvalidArgumentError("not a cleave quantized set (bad magic)");
  }
  uint32_t version = 0, spec_len = 0, count = 0;
  if (!r.Get(&version)) return Truncated("version");
  if (version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported quantized set version ", version));
  }
  if (!r.Get(&spec_len) || spec_len > 256 || !r.GetBytes(spec_len, &spec)) return Truncated("codec");
  if (spec != expected_spec) {
    return absl::InvalidArgumentError(absl::StrCat("a quantized set in codec '", Printable(spec),
                                                   "', expected ", expected_spec));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, MakeStatelessCodec(expected_spec, 0));
  if (codec == nullptr) return absl::InvalidArgumentError("a quantized set needs a codec");
  if (!r.Get(&count)) return Truncated("count");
  if (count > r.remaining() / 16) {
    return absl::InvalidArgumentError(absl::StrCat("tensor count ", count, " exceeds the data"));
  }
  QuantizedSet set;
  set.spec = expected_spec;
  std::unordered_set<std::string_view> names;
  int64_t total = 0;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t name_len = 0, ndim = 0;
    std::string_view name;
    if (!r.Get(&name_len) || name_len > 4096 || !r.GetBytes(name_len, &name)) return Truncated("name");
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name ", Printable(name)));
    }
    QuantizedTensor t;
    t.name = std::string(name);
    if (!r.Get(&ndim)) return Truncated("ndim");
    if (ndim > 8) return absl::InvalidArgumentError(absl::StrCat("tensor ", Printable(name), ": ndim > 8"));
    int64_t numel = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      int64_t dim = 0;
      if (!r.Get(&dim)) return Truncated("dims");
      if (dim < 0 || dim > max_elements || (numel *= dim) > max_elements) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", Printable(name), ": bad shape"));
      }
      t.shape.push_back(dim);
    }
    if ((total += numel) > max_elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("quantized set exceeds the limit of ", max_elements, " values"));
    }
    uint64_t len = 0;
    if (!r.Get(&len)) return Truncated("byte length");
    if (static_cast<int64_t>(len) != codec->EncodedSize(t.shape)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", Printable(name), ": ", len, " bytes, ",
                                                     expected_spec, " encodes its shape in ",
                                                     codec->EncodedSize(t.shape)));
    }
    if (!r.GetBytes(len, &t.bytes)) return Truncated("data");
    if (Status s = codec->Check(t.bytes, t.shape); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", Printable(name), ": ", s.message()));
    }
    t.owner = bytes;
    set.tensors.push_back(std::move(t));
  }
  if (r.remaining() != 0) return absl::InvalidArgumentError("trailing bytes after the quantized set");
  return set;
}

StatusOr<ParameterSet> DequantizeSet(const QuantizedSet& set) {
  if (set.empty()) return ParameterSet();
  ASSIGN_OR_RETURN(std::unique_ptr<Codec> codec, MakeStatelessCodec(set.spec, 0));
  if (codec == nullptr) return absl::InvalidArgumentError("a quantized set needs a codec");
  ParameterSet out;
  for (const QuantizedTensor& q : set.tensors) {
    Tensor t;
    t.name = q.name;
    t.shape = q.shape;
    t.values.resize(NumElements(q.shape));
    RETURN_IF_ERROR(codec->Decode(q.bytes, q.shape, t.values.data()));
    RETURN_IF_ERROR(out.Add(std::move(t)));
  }
  return out;
}

QuantizedTensor QuantizeTensor(Codec& codec, std::string name, std::vector<int64_t> shape,
                               const float* values) {
  auto bytes = std::make_shared<std::string>();
  codec.Encode(0, values, shape, bytes.get());
  QuantizedTensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.bytes = *bytes;
  t.owner = std::move(bytes);
  return t;
}

}  // namespace cleave
