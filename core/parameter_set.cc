#include "core/parameter_set.h"

#include <fnmatch.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "core/byte_reader.h"

namespace cleave {
namespace {

constexpr char kMagic[4] = {'C', 'L', 'V', 'P'};
constexpr uint32_t kVersion = 1;

template <typename T>
void Put(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out.append(buf, sizeof(T));
}


Status Truncated(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("parameter set truncated in ", std::string(what)));
}

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) absl::StrAppend(&r, i ? "," : "", s[i]);
  return r + "]";
}

}  // namespace

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Tensor::numel() const { return NumElements(shape); }

Status ParameterSet::Add(Tensor t) {
  for (int64_t d : t.shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dim in ", std::string(t.name)));
  }
  if (static_cast<int64_t>(t.values.size()) != t.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", std::string(t.name), " has ", t.values.size(),
                                                   " values for shape ", ShapeString(t.shape)));
  }
  if (Find(t.name) != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name ", std::string(t.name)));
  }
  tensors_.push_back(std::move(t));
  return absl::OkStatus();
}

int64_t ParameterSet::total_elements() const {
  int64_t n = 0;
  for (const auto& t : tensors_) n += t.numel();
  return n;
}

const Tensor* ParameterSet::Find(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

bool ParameterSet::SameLayout(const ParameterSet& other) const {
  return CheckSameLayout(other).ok();
}

Status ParameterSet::CheckSameLayout(const ParameterSet& other) const {
  if (other.tensors_.size() != tensors_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("expected ", tensors_.size(),
                                                   " tensors, got ", other.tensors_.size()));
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& a = tensors_[i];
    const Tensor& b = other.tensors_[i];
    if (a.name != b.name) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, ": expected name ", a.name, ", got ", b.name));
    }
    if (a.shape != b.shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", a.name, ": expected shape ",
                                                     ShapeString(a.shape), ", got ",
                                                     ShapeString(b.shape)));
    }
  }
  return absl::OkStatus();
}

ParameterSet ParameterSet::ZerosLike() const {
  ParameterSet z;
  for (const auto& t : tensors_) {
    z.tensors_.push_back(Tensor{t.name, t.shape, std::vector<float>(t.values.size(), 0.0f)});
  }
  return z;
}

size_t ParameterSet::EncodedSize() const {
  size_t n = 4 + 4 + 4;
  for (const auto& t : tensors_) {
    n += 4 + t.name.size() + 1 + 4 + 8 * t.shape.size() + 8 + 4 * t.values.size();
  }
  return n;
}

namespace {

// The encoding's header (magic, version, tensor count), and each tensor's ahead of its
// float32 values.
void AppendSetHeader(std::string& out, size_t tensors) {
  out.append(kMagic, 4);
  Put<uint32_t>(out, kVersion);
  Put<uint32_t>(out, static_cast<uint32_t>(tensors));
}

void AppendTensorHeader(std::string& out, std::string_view name, const std::vector<int64_t>& shape, int64_t numel) {
  Put<uint32_t>(out, static_cast<uint32_t>(name.size()));
  out.append(name);
  Put<uint8_t>(out, static_cast<uint8_t>(DType::kFloat32));
  Put<uint32_t>(out, static_cast<uint32_t>(shape.size()));
  for (int64_t d : shape) Put<int64_t>(out, d);
  Put<uint64_t>(out, static_cast<uint64_t>(numel) * sizeof(float));
}

}  // namespace

std::string ParameterSet::Encode() const {
  std::string out;
  out.reserve(EncodedSize());
  AppendSetHeader(out, tensors_.size());
  for (const auto& t : tensors_) {
    AppendTensorHeader(out, t.name, t.shape, static_cast<int64_t>(t.values.size()));
    out.append(reinterpret_cast<const char*>(t.values.data()), t.values.size() * sizeof(float));
  }
  return out;
}

StatusOr<std::vector<TensorView>> ParseParameterSet(std::string_view bytes,
                                                    int64_t max_elements) {
  ByteReader r(bytes);
  std::string_view magic;
  if (!r.GetBytes(4, &magic)) return Truncated("magic");
  if (std::memcmp(magic.data(), kMagic, 4) != 0) {
    return absl::InvalidArgumentError("not a cleave parameter set (bad magic)");
  }
  uint32_t version = 0, count = 0;
  if (!r.Get(&version)) return Truncated("version");
  if (version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported parameter set version ", version));
  }
  if (!r.Get(&count)) return Truncated("count");
  // Each tensor takes at least 17 bytes; reject counts the buffer cannot hold.
  if (count > r.remaining() / 17) {
    return absl::InvalidArgumentError(absl::StrCat("tensor count ", count, " exceeds the data"));
  }
  std::vector<TensorView> views;
  std::unordered_set<std::string_view> names;
  int64_t total = 0;
  for (uint32_t i = 0; i < count; ++i) {
    TensorView t;
    uint32_t name_len = 0;
    if (!r.Get(&name_len)) return Truncated("name length");
    if (name_len > 4096) return absl::InvalidArgumentError("tensor name too long");
    if (!r.GetBytes(name_len, &t.name)) return Truncated("name");
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name ", std::string(t.name)));
    }
    uint8_t dtype = 0;
    if (!r.Get(&dtype)) return Truncated("dtype");
    if (dtype != static_cast<uint8_t>(DType::kFloat32)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", std::string(t.name), ": unsupported dtype ", static_cast<int>(dtype)));
    }
    uint32_t ndim = 0;
    if (!r.Get(&ndim)) return Truncated("ndim");
    if (ndim > 8) return absl::InvalidArgumentError(absl::StrCat("tensor ", std::string(t.name), ": ndim > 8"));
    t.numel = 1;
    for (uint32_t d = 0; d < ndim; ++d) {
      int64_t dim = 0;
      if (!r.Get(&dim)) return Truncated("dims");
      if (dim < 0 || dim > max_elements) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", std::string(t.name), ": bad dim ", dim));
      }
      t.numel *= dim;
      if (t.numel > max_elements) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", std::string(t.name), " is too large"));
      }
      t.shape.push_back(dim);
    }
    total += t.numel;
    if (total > max_elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter set exceeds the limit of ", max_elements, " elements"));
    }
    uint64_t byte_len = 0;
    if (!r.Get(&byte_len)) return Truncated("byte length");
    if (byte_len != static_cast<uint64_t>(t.numel) * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", std::string(t.name), ": ", byte_len,
                                                     " bytes for shape ", ShapeString(t.shape)));
    }
    std::string_view data;
    if (!r.GetBytes(byte_len, &data)) return Truncated(absl::StrCat("data of ", std::string(t.name)));
    t.data = data.data();
    views.push_back(std::move(t));
  }
  if (r.remaining() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter set has ", r.remaining(), " trailing bytes"));
  }
  return views;
}

void TensorView::Read(int64_t begin, int64_t count, float* out) const {
  if (decoder != nullptr) {
    decoder->DecodeRange(std::string_view(data, encoded_size), shape, begin, count, out);
  } else {
    std::memcpy(out, data + begin * sizeof(float), count * sizeof(float));
  }
  if (scale != 1.0f) {
    for (int64_t i = 0; i < count; ++i) out[i] *= scale;
  }
}

namespace {

// Index of the first value in `v` that is not finite or whose magnitude exceeds the
// bound whose bit pattern is `max_bits`, or -1. For non-negative floats the bit patterns
// order as the values do, and Inf and NaN lie above every finite one, so one integer
// compare on the raw words tests both and the loop vectorizes.
int64_t FirstOutOfRange(const TensorView& v, uint32_t max_bits) {
  alignas(64) float values[kViewBlock];
  auto bad = [&](int64_t j) {
    uint32_t w;
    std::memcpy(&w, values + j, 4);
    return (w & 0x7fffffffu) > max_bits;
  };
  for (int64_t b = 0; b < v.numel; b += kViewBlock) {
    const int64_t n = std::min(kViewBlock, v.numel - b);
    v.Read(b, n, values);  // decodes a compressed view
    uint32_t any = 0;
    for (int64_t j = 0; j < n; ++j) any |= bad(j);
    if (any) {
      for (int64_t j = 0; j < n; ++j) {
        if (bad(j)) return b + j;
      }
    }
  }
  return -1;
}

}  // namespace

Status CheckViews(const ParameterSet& layout, const std::vector<TensorView>& views,
                  float max_abs) {
  const auto& tensors = layout.tensors();
  if (views.size() != tensors.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", tensors.size(), " tensors, got ", views.size()));
  }
  if (!(max_abs >= 0)) max_abs = 0;
  uint32_t max_bits;
  std::memcpy(&max_bits, &max_abs, 4);
  for (size_t i = 0; i < views.size(); ++i) {
    const TensorView& v = views[i];
    if (v.name != tensors[i].name) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, ": expected name ", tensors[i].name, ", got ", std::string(v.name)));
    }
    if (v.shape != tensors[i].shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", std::string(v.name), ": expected shape ",
                                                     ShapeString(tensors[i].shape), ", got ",
                                                     ShapeString(v.shape)));
    }
    if (const int64_t j = FirstOutOfRange(v, max_bits); j >= 0) {
      float x;
      v.Read(j, 1, &x);
      if (!std::isfinite(x)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", std::string(v.name), " has a non-finite value at index ", j));
      }
      return absl::InvalidArgumentError(absl::StrCat("tensor ", std::string(v.name), " has ", x,
                                                     " at index ", j, ", beyond the bound ",
                                                     max_abs));
    }
  }
  return absl::OkStatus();
}

StatusOr<ParameterSet> ParameterSet::Decode(std::string_view bytes, int64_t max_elements) {
  ASSIGN_OR_RETURN(std::vector<TensorView> views, ParseParameterSet(bytes, max_elements));
  ParameterSet ps;
  for (const TensorView& v : views) {
    Tensor t{std::string(v.name), v.shape, std::vector<float>(v.numel)};
    std::memcpy(t.values.data(), v.data, v.numel * sizeof(float));
    ps.tensors_.push_back(std::move(t));
  }
  return ps;
}

std::vector<TensorView> ViewsOf(const ParameterSet& set) {
  std::vector<TensorView> views;
  for (const auto& t : set.tensors()) {
    TensorView v;
    v.name = t.name;
    v.shape = t.shape;
    v.data = reinterpret_cast<const char*>(t.values.data());
    v.numel = static_cast<int64_t>(t.values.size());
    views.push_back(std::move(v));
  }
  return views;
}

namespace {

std::string Hex(const unsigned char* md, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

}  // namespace

std::string Sha256Hex(std::string_view bytes) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), md);
  return Hex(md, SHA256_DIGEST_LENGTH);
}

std::string EncodedSha256Hex(const std::vector<TensorView>& views) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::string head;  // the encoding up to each tensor's values, as Encode writes it
  auto flush = [&] {
    EVP_DigestUpdate(ctx.get(), head.data(), head.size());
    head.clear();
  };
  AppendSetHeader(head, views.size());
  for (const TensorView& t : views) {
    AppendTensorHeader(head, t.name, t.shape, t.numel);
    flush();
    EVP_DigestUpdate(ctx.get(), t.data, static_cast<size_t>(t.numel) * sizeof(float));
  }
  flush();
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &n);
  return Hex(md, n);
}

StatusOr<std::vector<std::string>> MatchTensorNames(const ParameterSet& set,
                                                    const std::vector<std::string>& patterns) {
  std::vector<bool> hit(set.size(), false);
  for (const std::string& p : patterns) {
    bool any = false;
    for (size_t i = 0; i < set.size(); ++i) {
      if (fnmatch(p.c_str(), set.tensors()[i].name.c_str(), 0) == 0) hit[i] = any = true;
    }
    if (!any) {
      std::string names;
      for (const Tensor& t : set.tensors()) absl::StrAppend(&names, names.empty() ? "" : " ", t.name);
      return absl::InvalidArgumentError(
          absl::StrCat("'", p, "' matches no tensor of the model (it has: ", names, ")"));
    }
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < set.size(); ++i) {
    if (hit[i]) out.push_back(set.tensors()[i].name);
  }
  return out;
}

namespace {
ParameterSet Select(const ParameterSet& set, const std::vector<std::string>& names, bool keep) {
  const std::unordered_set<std::string> named(names.begin(), names.end());
  ParameterSet out;
  for (const Tensor& t : set.tensors()) {
    if (named.count(t.name) == static_cast<size_t>(keep)) out.mutable_tensors().push_back(t);
  }
  return out;
}
}  // namespace

ParameterSet Only(const ParameterSet& set, const std::vector<std::string>& names) {
  return Select(set, names, true);
}

ParameterSet Without(const ParameterSet& set, const std::vector<std::string>& names) {
  return Select(set, names, false);
}

Status Overwrite(const ParameterSet& part, ParameterSet* set) {
  std::vector<Tensor*> targets;
  for (const Tensor& t : part.tensors()) {
    Tensor* target = nullptr;
    for (Tensor& u : set->mutable_tensors()) {
      if (u.name == t.name) {
        target = &u;
        break;
      }
    }
    if (target == nullptr || target->shape != t.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, target ? " has another shape" : " is not in the model"));
    }
    targets.push_back(target);
  }
  for (size_t i = 0; i < targets.size(); ++i) targets[i]->values = part.tensors()[i].values;
  return absl::OkStatus();
}

}  // namespace cleave
