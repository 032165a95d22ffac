#include "data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "data/sources.h"

namespace cleave {

int64_t Dataset::example_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Dataset::example_bytes() const {
  return example_elements() * (type == ExampleType::kUint8 ? 1 : int64_t{4});
}

int32_t Dataset::token(int64_t example, int64_t position) const {
  int32_t id;
  std::memcpy(&id, bytes.data() + (example * example_elements() + position) * sizeof(id),
              sizeof(id));
  return id < 0 ? -1 - id : id;
}

int64_t Dataset::target(int64_t example, int64_t position) const {
  int32_t id;
  std::memcpy(&id, bytes.data() + (example * example_elements() + position) * sizeof(id),
              sizeof(id));
  return id < 0 ? kNoTarget : id;
}

Dataset Dataset::Subset(const std::vector<int64_t>& indices) const {
  // Every field but the per-example vectors, filled below: copying *this whole would
  // copy all examples' bytes, and keep their capacity after the resize (a client of a
  // partition held the whole data set's memory).
  Dataset d;
  d.type = type;
  d.shape = shape;
  d.num_classes = num_classes;
  d.mean = mean;
  d.stddev = stddev;
  d.group_names = group_names;
  d.augment = augment;
  d.standardised = standardised;
  d.tokenizer = tokenizer;
  d.bytes_per_token = bytes_per_token;
  d.size = static_cast<int64_t>(indices.size());
  const int64_t eb = example_bytes();
  d.bytes.resize(indices.size() * eb);
  d.labels.resize(indices.size());
  if (!groups.empty()) d.groups.resize(indices.size());
  if (!targets.empty()) d.targets.resize(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    std::memcpy(&d.bytes[i * eb], &bytes[indices[i] * eb], eb);
    d.labels[i] = labels[indices[i]];
    if (!groups.empty()) d.groups[i] = groups[indices[i]];
    if (!targets.empty()) d.targets[i] = targets[indices[i]];
  }
  return d;
}

namespace {

// Example i's raw values as floats (pixels / 255).
void RawValues(const Dataset& d, int64_t i, float* out) {
  const int64_t n = d.example_elements();
  if (d.type == ExampleType::kUint8) {
    const uint8_t* px = d.bytes.data() + i * n;
    for (int64_t j = 0; j < n; ++j) out[j] = px[j] / 255.0f;
  } else if (d.type == ExampleType::kToken) {
    for (int64_t j = 0; j < n; ++j) out[j] = static_cast<float>(d.token(i, j));  // exact: < 2^24
  } else {
    std::memcpy(out, d.bytes.data() + i * n * sizeof(float), n * sizeof(float));
  }
}

}  // namespace

void Dataset::Normalised(int64_t i, float* out) const {
  RawValues(*this, i, out);
  if (mean.empty()) return;
  const int64_t n = example_elements();
  const int64_t inner = n / shape[0];  // elements per channel (or 1 per feature)
  for (int64_t j = 0; j < n; ++j) {
    const size_t c = mean.size() == 1 ? 0 : static_cast<size_t>(j / inner);
    out[j] = (out[j] - mean[c]) / stddev[c];
  }
}

void Dataset::Standardise() {
  const int64_t n = example_elements(), channels = shape[0], inner = n / channels;
  std::vector<double> sum(channels), sq(channels);
  std::vector<float> x(n);
  for (int64_t i = 0; i < size; ++i) {
    RawValues(*this, i, x.data());
    for (int64_t j = 0; j < n; ++j) {
      sum[j / inner] += x[j];
      sq[j / inner] += double{x[j]} * x[j];
    }
  }
  mean.assign(channels, 0.0f);
  stddev.assign(channels, 1.0f);
  const double count = static_cast<double>(size) * inner;
  for (int64_t c = 0; c < channels && count > 0; ++c) {
    const double m = sum[c] / count, var = sq[c] / count - m * m;
    mean[c] = static_cast<float>(m);
    if (var > 1e-12) stddev[c] = static_cast<float>(std::sqrt(var));
  }
  standardised = true;
}

// ---- Spec options ----

StatusOr<SpecOptions> SpecOptions::Parse(const std::vector<std::string>& items,
                                         const std::string& spec) {
  SpecOptions o;
  o.spec_ = spec;
  for (const std::string& item : items) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.first.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("empty option in data spec '", spec, "'"));
    }
    if (item.find('=') == std::string::npos) kv.second = "1";
    if (!o.values_.emplace(kv.first, kv.second).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("option '", kv.first, "' given twice in data spec '", spec, "'"));
    }
  }
  return o;
}

bool SpecOptions::Has(const std::string& key) { return values_.count(key) > 0; }

std::string SpecOptions::String(const std::string& key, const std::string& fallback) {
  return Has(key) ? values_.at(key) : fallback;
}

StatusOr<int64_t> SpecOptions::Int(const std::string& key, int64_t fallback, int64_t min,
                                   int64_t max) {
  if (!Has(key)) return fallback;
  int64_t v = 0;
  if (!absl::SimpleAtoi(values_.at(key), &v) || v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat("data option ", key, "=", values_.at(key),
                                                   ": expected a whole number in [", min, ", ",
                                                   max, "] (", spec_, ")"));
  }
  return v;
}

StatusOr<double> SpecOptions::Double(const std::string& key, double fallback, double min,
                                      double max) {
  if (!Has(key)) return fallback;
  double v = 0;
  if (!absl::SimpleAtod(values_.at(key), &v) || !(v >= min && v <= max)) {
    return absl::InvalidArgumentError(absl::StrCat("data option ", key, "=", values_.at(key),
                                                   ": expected a number in [", min, ", ", max,
                                                   "] (", spec_, ")"));
  }
  return v;
}

StatusOr<std::vector<float>> SpecOptions::Floats(const std::string& key,
                                                 std::vector<float> fallback, bool positive) {
  if (!Has(key)) return fallback;
  std::vector<float> out;
  for (absl::string_view part : absl::StrSplit(values_.at(key), '/')) {
    float v = 0;
    if (!absl::SimpleAtof(part, &v) || !std::isfinite(v) || (positive && !(v > 0))) {
      return absl::InvalidArgumentError(
          absl::StrCat("data option ", key, "=", values_.at(key), ": expected ",
                       positive ? "positive " : "", "numbers separated by '/' (", spec_, ")"));
    }
    out.push_back(v);
  }
  return out;
}

Status SpecOptions::CheckKnown(const std::vector<std::string>& known) const {
  for (const auto& [key, value] : values_) {
    if (std::find(known.begin(), known.end(), key) == known.end() &&
        std::find(kCommonOptions.begin(), kCommonOptions.end(), key) == kCommonOptions.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown option '", key, "' in data spec '", spec_, "' (this source takes ",
          absl::StrJoin(known, ", "), known.empty() ? "" : ", ",
          absl::StrJoin(kCommonOptions, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

namespace {

// The first `n` examples of `d` left out (its bytes too when it holds them).
void DropFirst(int64_t n, Dataset& d) {
  n = std::min(n, d.size);
  if (n <= 0) return;
  const auto drop = [n](auto& v, int64_t per) {
    if (!v.empty()) v.erase(v.begin(), v.begin() + n * per);
  };
  if (!d.bytes.empty()) drop(d.bytes, d.example_bytes());
  drop(d.labels, 1);
  drop(d.groups, 1);
  drop(d.targets, 1);
  d.size -= n;
}

}  // namespace

Status ApplyCommonOptions(SpecOptions& o, Dataset& d) {
  ASSIGN_OR_RETURN(const int64_t offset, o.Int("offset", 0, 0, INT64_MAX));
  if (!o.offset_taken) DropFirst(offset, d);
  ASSIGN_OR_RETURN(int64_t limit, o.Int("limit", 0, 0, INT64_MAX));
  if (limit > 0 && limit < d.size && !o.part_taken) {
    d.size = limit;
    d.bytes.resize(limit * d.example_bytes());
    d.labels.resize(limit);
    if (!d.groups.empty()) d.groups.resize(limit);
    if (!d.targets.empty()) d.targets.resize(limit);
  }
  if (d.type == ExampleType::kToken &&
      (o.Has("standardise") || o.Has("mean") || o.Has("std"))) {
    return absl::InvalidArgumentError("standardise, mean and std do not apply to text");
  }
  if (o.Has("standardise")) {
    d.Standardise();
  } else {
    ASSIGN_OR_RETURN(d.mean, o.Floats("mean", d.mean, /*positive=*/false));
    ASSIGN_OR_RETURN(d.stddev, o.Floats("std", d.stddev, /*positive=*/true));
    if (d.mean.empty() && !d.stddev.empty()) d.mean = {0.0f};
    if (d.stddev.empty() && !d.mean.empty()) d.stddev = {1.0f};
  }
  for (const auto* v : {&d.mean, &d.stddev}) {
    if (v->size() > 1 && static_cast<int64_t>(v->size()) != d.shape[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat("mean/std: give one value or ", d.shape[0], " (one per channel or feature)"));
    }
  }
  const bool image = d.shape.size() == 3;
  ASSIGN_OR_RETURN(d.augment.crop_padding, o.Int("crop", 0, 0, 64));
  d.augment.flip = o.Has("flip");
  if (d.augment.enabled() && !image) {
    return absl::InvalidArgumentError("crop and flip apply to images only");
  }
  return absl::OkStatus();
}

StatusOr<Dataset> ReadPart(SpecOptions& o, Dataset index, const ExampleReader& read) {
  ASSIGN_OR_RETURN(const int64_t offset, o.Int("offset", 0, 0, INT64_MAX));
  const int64_t first = std::min(offset, index.size);  // the file's example of index 0
  DropFirst(first, index);
  o.offset_taken = true;
  ASSIGN_OR_RETURN(int64_t limit, o.Int("limit", 0, 0, INT64_MAX));
  if (limit > 0 && limit < index.size) {  // as ApplyCommonOptions cuts the whole set
    index.size = limit;
    index.labels.resize(limit);
    if (!index.groups.empty()) index.groups.resize(limit);
    if (!index.targets.empty()) index.targets.resize(limit);
  }
  std::vector<int64_t> keep;
  if (o.part) {
    ASSIGN_OR_RETURN(keep, o.part(index));
  } else {
    keep.resize(static_cast<size_t>(index.size));
    std::iota(keep.begin(), keep.end(), 0);
  }
  std::vector<std::pair<int64_t, int64_t>> order;  // (example, place in the part)
  for (size_t k = 0; k < keep.size(); ++k) {
    if (keep[k] < 0 || keep[k] >= index.size) {
      return absl::InvalidArgumentError(absl::StrCat("a part's example ", keep[k], " is not in [0, ", index.size, ")"));
    }
    order.emplace_back(keep[k], static_cast<int64_t>(k));
  }
  std::sort(order.begin(), order.end());
  Dataset d = std::move(index);
  const std::vector<int64_t> labels = std::move(d.labels);
  const std::vector<int32_t> groups = std::move(d.groups);
  const std::vector<float> targets = std::move(d.targets);
  d.size = static_cast<int64_t>(keep.size());
  d.labels.resize(keep.size());
  d.groups.resize(groups.empty() ? 0 : keep.size());
  d.targets.resize(targets.empty() ? 0 : keep.size());
  for (size_t k = 0; k < keep.size(); ++k) {
    d.labels[k] = labels[keep[k]];
    if (!groups.empty()) d.groups[k] = groups[keep[k]];
    if (!targets.empty()) d.targets[k] = targets[keep[k]];
  }
  d.bytes.clear();
  std::vector<uint8_t> example;
  size_t eb = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto [e, place] = order[i];
    if (i == 0 || e != order[i - 1].first) {
      RETURN_IF_ERROR(read(first + e, example));
      if (i == 0) {
        eb = example.size();
        d.bytes.resize(keep.size() * eb);
      } else if (example.size() != eb) {
        return absl::InternalError(absl::StrCat("example ", e, " has ", example.size(),
                                                " bytes, example ", order[0].first, " ", eb));
      }
    }
    std::memcpy(d.bytes.data() + place * eb, example.data(), eb);
  }
  o.part_taken = static_cast<bool>(o.part);
  return d;
}

// ---- IDX (MNIST, Fashion-MNIST) ----

namespace {

// A gzip file or, when `path`.gz is absent, the uncompressed `path`, read in order.
class GzReader {
 public:
  static StatusOr<std::unique_ptr<GzReader>> Open(const std::string& path) {
    std::string chosen = path + ".gz";
    gzFile f = gzopen(chosen.c_str(), "rb");
    if (f == nullptr) {
      chosen = path;
      f = gzopen(chosen.c_str(), "rb");  // zlib reads an uncompressed file as it is
    }
    if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", path, "(.gz)"));
    gzbuffer(f, 1 << 16);
    return std::unique_ptr<GzReader>(new GzReader(f, chosen));
  }
  ~GzReader() { gzclose(f_); }

  // Reads up to n bytes (fewer at the end of the file); DATA_LOSS for a gzip stream that
  // is corrupt or ends inside itself (zlib's Z_BUF_ERROR behind a read of 0 bytes).
  StatusOr<size_t> Read(void* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
      const int got = gzread(f_, static_cast<char*>(out) + done, chunk);
      if (got < 0) return Error();
      if (got == 0) {
        int err = Z_OK;
        gzerror(f_, &err);
        if (err != Z_OK && err != Z_STREAM_END) return Error();
        break;
      }
      done += static_cast<size_t>(got);
    }
    return done;
  }
  // Reads exactly n bytes; DATA_LOSS naming `what` when the file ends first.
  Status ReadExactly(void* out, size_t n, const std::string& what) {
    ASSIGN_OR_RETURN(size_t got, Read(out, n));
    if (got != n) return absl::DataLossError(absl::StrCat(path_, ": ends inside ", what));
    return absl::OkStatus();
  }
  // Passes over n bytes (decompressing them: gzip has no index).
  Status Skip(int64_t n, const std::string& what) {
    char buf[1 << 16];
    while (n > 0) {
      const size_t chunk = static_cast<size_t>(std::min<int64_t>(n, sizeof(buf)));
      RETURN_IF_ERROR(ReadExactly(buf, chunk, what));
      n -= static_cast<int64_t>(chunk);
    }
    return absl::OkStatus();
  }
  StatusOr<bool> AtEnd() {
    char c;
    ASSIGN_OR_RETURN(size_t got, Read(&c, 1));
    return got == 0;
  }

 private:
  GzReader(gzFile f, std::string path) : f_(f), path_(std::move(path)) {}
  Status Error() {
    int err = 0;
    const char* msg = gzerror(f_, &err);
    return absl::DataLossError(absl::StrCat("corrupt gzip ", path_, ": ", msg));
  }
  gzFile f_;
  std::string path_;
};

uint32_t BigEndian32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

}  // namespace

// The labels are read whole (a byte each); the images straight into the Dataset, all of
// them or, with a part to keep (SpecOptions::part), only the kept ones: the whole file is
// never in memory.
StatusOr<Dataset> LoadIdx(const std::string& dir, bool train, SpecOptions& o) {
  const std::string prefix = dir + (train ? "/train" : "/t10k");
  const std::string img_path = prefix + "-images-idx3-ubyte", lab_path = prefix + "-labels-idx1-ubyte";
  ASSIGN_OR_RETURN(auto img, GzReader::Open(img_path));
  ASSIGN_OR_RETURN(auto lab, GzReader::Open(lab_path));
  unsigned char ih[16], lh[8];
  ASSIGN_OR_RETURN(size_t ih_got, img->Read(ih, sizeof ih));
  if (ih_got < sizeof ih || BigEndian32(ih) != 0x803) {
    return absl::DataLossError(absl::StrCat(img_path, ": not an IDX3 ubyte file"));
  }
  ASSIGN_OR_RETURN(size_t lh_got, lab->Read(lh, sizeof lh));
  if (lh_got < sizeof lh || BigEndian32(lh) != 0x801) {
    return absl::DataLossError(absl::StrCat(lab_path, ": not an IDX1 ubyte file"));
  }
  const int64_t n = BigEndian32(ih + 4), rows = BigEndian32(ih + 8), cols = BigEndian32(ih + 12);
  if (BigEndian32(lh + 4) != n) {
    return absl::DataLossError(absl::StrCat(prefix, ": image and label counts differ"));
  }
  if (rows < 1 || cols < 1 || rows * cols > (int64_t{1} << 24)) {
    return absl::DataLossError(absl::StrCat(img_path, ": images of ", rows, " x ", cols));
  }
  Dataset index;  // every example's label; no bytes
  index.size = n;
  index.shape = {1, rows, cols};
  index.mean = {0.2860f};  // Fashion-MNIST training-set statistics
  index.stddev = {0.3530f};
  std::vector<unsigned char> labels(static_cast<size_t>(n));
  RETURN_IF_ERROR(lab->ReadExactly(labels.data(), labels.size(), "its labels"));
  ASSIGN_OR_RETURN(bool labels_end, lab->AtEnd());
  if (!labels_end) return absl::DataLossError(absl::StrCat(prefix, ": IDX sizes do not match the header"));
  index.labels.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    index.labels[i] = labels[i];
    if (index.labels[i] >= index.num_classes) {
      return absl::DataLossError(absl::StrCat(lab_path, ": entry ", i, ": label ", index.labels[i],
                                              " is not in [0, ", index.num_classes, ")"));
    }
  }
  const int64_t eb = rows * cols;
  if (!o.part) {
    Dataset d = std::move(index);
    d.bytes.resize(static_cast<size_t>(n * eb));
    RETURN_IF_ERROR(img->ReadExactly(d.bytes.data(), d.bytes.size(), "its images"));
    ASSIGN_OR_RETURN(bool end, img->AtEnd());
    if (!end) return absl::DataLossError(absl::StrCat(prefix, ": IDX sizes do not match the header"));
    return d;
  }
  int64_t at = 0;  // the next example of the file
  ASSIGN_OR_RETURN(Dataset d, ReadPart(o, std::move(index), [&](int64_t example, std::vector<uint8_t>& out) -> Status {
    RETURN_IF_ERROR(img->Skip((example - at) * eb, "its images"));
    out.resize(static_cast<size_t>(eb));
    at = example + 1;
    return img->ReadExactly(out.data(), out.size(), "its images");
  }));
  RETURN_IF_ERROR(img->Skip((n - at) * eb, "its images"));
  ASSIGN_OR_RETURN(bool end, img->AtEnd());
  if (!end) return absl::DataLossError(absl::StrCat(prefix, ": IDX sizes do not match the header"));
  return d;
}

StatusOr<Dataset> LoadFashionMnist(const std::string& dir, bool train, int64_t limit) {
  return LoadDataSpec(limit > 0 ? absl::StrCat("idx:", dir, ",limit=", limit) : "idx:" + dir,
                      train);
}

// ---- Specs ----

namespace {
const std::vector<std::string> kTableOptions = {"label", "header", "skip", "classes", "group",
                                                "drop", "regression"};
}  // namespace

Registry<DataSource>& DataSources() {
  static Registry<DataSource>* r = [] {
    auto* r = new Registry<DataSource>("data source");
    r->AddBuiltin("idx", {{}, LoadIdx});
    r->AddBuiltin("fmnist", {{}, LoadIdx});
    r->AddBuiltin("folder", {{"channels", "size", "groups"}, LoadImageFolder});
    r->AddBuiltin("cifar10", {{}, [](const std::string& p, bool t, SpecOptions& o) {
                                return LoadCifar(p, t, 10, o);
                              }});
    r->AddBuiltin("cifar100", {{"labels"}, [](const std::string& p, bool t, SpecOptions& o) {
                                 return LoadCifar(p, t, 100, o);
                               }});
    r->AddBuiltin("csv", {kTableOptions, [](const std::string& p, bool, SpecOptions& o) {
                            return LoadTable(p, ',', o);
                          }});
    r->AddBuiltin("tsv", {kTableOptions, [](const std::string& p, bool, SpecOptions& o) {
                            return LoadTable(p, '\t', o);
                          }});
    r->AddBuiltin("text", {{"tokenizer", "context", "test", "field"}, LoadText});
    r->AddBuiltin("instruct", {{"tokenizer", "context", "test", "template"}, LoadInstruct});
    return r;
  }();
  return *r;
}

std::vector<std::string> DataSourceNames() { return DataSources().Names(); }

StatusOr<Dataset> LoadDataSpec(const std::string& spec, bool train) {
  return LoadDataSpecPart(spec, train, PartFilter());
}

StatusOr<Dataset> LoadDataSpecPart(const std::string& spec, bool train, const PartFilter& part) {
  std::vector<std::string> items = absl::StrSplit(spec, ',');
  const size_t colon = items[0].find(':');
  const std::string name = items[0].substr(0, colon);
  const DataSource* source = DataSources().Find(name);
  if (source == nullptr || colon == std::string::npos || colon + 1 == items[0].size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown data spec '", spec, "' (expected SOURCE:PATH[,OPTION...] with SOURCE ",
                     absl::StrJoin(DataSourceNames(), ", "), ")"));
  }
  const std::string path = items[0].substr(colon + 1);
  ASSIGN_OR_RETURN(SpecOptions options,
                   SpecOptions::Parse(std::vector<std::string>(items.begin() + 1, items.end()),
                                      spec));
  RETURN_IF_ERROR(options.CheckKnown(source->options));
  options.part = part;
  ASSIGN_OR_RETURN(Dataset d, source->load(path, train, options));
  RETURN_IF_ERROR(ApplyCommonOptions(options, d));
  if (part && !options.part_taken) {
    if (d.size == 0) return absl::InvalidArgumentError(absl::StrCat("no examples in ", path));
    ASSIGN_OR_RETURN(std::vector<int64_t> keep, part(d));
    d = PartOf(d, keep);
  }
  if (d.size == 0) return absl::InvalidArgumentError(absl::StrCat("no examples in ", path));
  return d;
}

Dataset TakeHoldout(Dataset* data, double fraction, uint64_t seed) {
  if (!(fraction > 0) || data->size < 2) return Dataset();
  std::vector<int64_t> order(data->size);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  const int64_t k = std::clamp<int64_t>(std::llround(fraction * data->size), 1, data->size - 1);
  std::vector<int64_t> held(order.begin(), order.begin() + k), kept(order.begin() + k, order.end());
  std::sort(held.begin(), held.end());
  std::sort(kept.begin(), kept.end());
  Dataset holdout = data->Subset(held);
  *data = data->Subset(kept);
  return holdout;
}

StatusOr<PartFilter> PartitionFilter(const std::string& spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, ',');
  int64_t index = -1, count = 0;
  uint64_t seed = 42;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::pair<std::string, std::string> kv = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    const bool ok = (kv.first == "client" && absl::SimpleAtoi(kv.second, &index)) ||
                    (kv.first == "of" && absl::SimpleAtoi(kv.second, &count)) ||
                    (kv.first == "seed" && absl::SimpleAtoi(kv.second, &seed));
    if (!ok) return absl::InvalidArgumentError("bad partition option '" + parts[i] + "'");
  }
  if (count < 1 || count > 1000000 || index < 0 || index >= count) {
    return absl::InvalidArgumentError("a partition needs client=I,of=N with 0 <= I < N");
  }
  const std::string scheme = parts[0];
  return PartFilter([scheme, index, count, seed](const Dataset& d) -> StatusOr<std::vector<int64_t>> {
    ASSIGN_OR_RETURN(auto split, PartitionDataset(d, scheme, static_cast<int>(count), seed));
    return std::move(split[index]);
  });
}

Status TakePartition(const std::string& spec, Dataset* data) {
  ASSIGN_OR_RETURN(PartFilter part, PartitionFilter(spec));
  ASSIGN_OR_RETURN(std::vector<int64_t> keep, part(*data));
  *data = PartOf(*data, keep);
  return absl::OkStatus();
}

Dataset PartOf(const Dataset& data, const std::vector<int64_t>& indices) {
  Dataset part = data.Subset(indices);
  if (part.standardised && part.size > 0) part.Standardise();
  return part;
}

}  // namespace cleave
