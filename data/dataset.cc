#include "data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace cleave {
namespace {

StatusOr<std::string> ReadGzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
  int err = 0;
  const char* msg = gzerror(f, &err);
  gzclose(f);
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) {
    return absl::DataLossError(absl::StrCat("corrupt gzip ", path, ": ", msg));
  }
  return out;
}

uint32_t BigEndian32(const std::string& b, size_t off) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data() + off);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

Dataset Dataset::Subset(const std::vector<int64_t>& indices) const {
  Dataset d = *this;
  d.size = static_cast<int64_t>(indices.size());
  const int64_t eb = example_bytes();
  d.images.resize(indices.size() * eb);
  d.labels.resize(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    std::memcpy(&d.images[i * eb], &images[indices[i] * eb], eb);
    d.labels[i] = labels[indices[i]];
  }
  return d;
}

StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train, int64_t limit) {
  const std::string prefix = dir + (train ? "/train" : "/t10k");
  ASSIGN_OR_RETURN(std::string img, ReadGzip(prefix + "-images-idx3-ubyte.gz"));
  ASSIGN_OR_RETURN(std::string lab, ReadGzip(prefix + "-labels-idx1-ubyte.gz"));
  if (img.size() < 16 || BigEndian32(img, 0) != 0x803) {
    return absl::DataLossError(absl::StrCat(prefix, "-images: not an IDX3 ubyte file"));
  }
  if (lab.size() < 8 || BigEndian32(lab, 0) != 0x801) {
    return absl::DataLossError(absl::StrCat(prefix, "-labels: not an IDX1 ubyte file"));
  }
  const int64_t n = BigEndian32(img, 4);
  const int64_t rows = BigEndian32(img, 8), cols = BigEndian32(img, 12);
  if (BigEndian32(lab, 4) != n) return absl::DataLossError("image and label counts differ");
  if (static_cast<int64_t>(img.size()) != 16 + n * rows * cols ||
      static_cast<int64_t>(lab.size()) != 8 + n) {
    return absl::DataLossError(absl::StrCat(prefix, ": IDX sizes do not match the header"));
  }
  Dataset d;
  d.size = (limit > 0 && limit < n) ? limit : n;
  d.height = static_cast<int>(rows);
  d.width = static_cast<int>(cols);
  d.mean = 0.2860f;  // Fashion-MNIST training-set statistics
  d.stddev = 0.3530f;
  d.images.assign(img.begin() + 16, img.begin() + 16 + d.size * rows * cols);
  d.labels.resize(d.size);
  for (int64_t i = 0; i < d.size; ++i) {
    d.labels[i] = static_cast<unsigned char>(lab[8 + i]);
    if (d.labels[i] >= d.num_classes) return absl::DataLossError("label out of range");
  }
  return d;
}

StatusOr<Dataset> LoadDataSpec(const std::string& spec, bool train) {
  std::vector<std::string> parts = absl::StrSplit(spec, ',');
  const std::string& head = parts[0];
  int64_t limit = 0;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    if (kv.first != "limit" || !absl::SimpleAtoi(kv.second, &limit) || limit < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad data option '", parts[i], "' in ", spec));
    }
  }
  if (head.rfind("fmnist:", 0) == 0) return LoadFashionMnist(head.substr(7), train, limit);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data spec '", spec, "' (expected fmnist:DIR[,limit=N])"));
}

}  // namespace cleave
