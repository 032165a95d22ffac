// The CIFAR-10 and CIFAR-100 binary formats (https://www.cs.toronto.edu/~kriz/cifar.html):
// records of label byte(s) then 3072 pixel bytes, red plane, green plane, blue plane.
#include <sys/stat.h>

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "data/sources.h"

namespace cleave {
namespace {

constexpr int64_t kPixels = 3 * 32 * 32;

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

}  // namespace

StatusOr<Dataset> LoadCifar(const std::string& dir, bool train, int classes, SpecOptions& o) {
  std::vector<std::string> files;
  int label_bytes = 1, label_offset = 0;
  if (classes == 10) {
    if (train) {
      for (int i = 1; i <= 5; ++i) files.push_back(absl::StrCat(dir, "/data_batch_", i, ".bin"));
    } else {
      files.push_back(dir + "/test_batch.bin");
    }
  } else {
    files.push_back(dir + (train ? "/train.bin" : "/test.bin"));
    label_bytes = 2;  // coarse, fine
    const std::string which = o.String("labels", "fine");
    if (which != "fine" && which != "coarse") {
      return absl::InvalidArgumentError("cifar100 labels=fine|coarse, got " + which);
    }
    label_offset = which == "fine" ? 1 : 0;
    classes = which == "fine" ? 100 : 20;
  }
  // A training set may come in fewer batch files (a sample); at least the first must exist.
  while (files.size() > 1 && !Exists(files.back())) files.pop_back();
  Dataset d;
  d.shape = {3, 32, 32};
  d.num_classes = classes;
  if (classes == 10) {  // the CIFAR-10 training set's channel statistics
    d.mean = {0.4914f, 0.4822f, 0.4465f};
    d.stddev = {0.2470f, 0.2435f, 0.2616f};
  } else {
    d.mean = {0.5071f, 0.4865f, 0.4409f};
    d.stddev = {0.2673f, 0.2564f, 0.2762f};
  }
  // The index: every record's label, read in chunks; the pixels are read by ReadPart,
  // only those of the examples kept.
  const int64_t record = label_bytes + kPixels;
  std::vector<std::ifstream> streams;
  std::vector<int64_t> first;  // the first example of each file
  std::vector<char> chunk(static_cast<size_t>(256 * record));
  for (const std::string& path : files) {
    ASSIGN_OR_RETURN(std::ifstream in, OpenForReading(path));
    in.seekg(0, std::ios::end);
    const int64_t bytes = static_cast<int64_t>(in.tellg());
    if (bytes <= 0 || bytes % record != 0) {
      return absl::DataLossError(absl::StrCat(path, ": ", bytes,
                                              " bytes is not a whole number of ", record,
                                              "-byte CIFAR records"));
    }
    in.seekg(0);
    first.push_back(d.size);
    const int64_t n = bytes / record;
    for (int64_t i = 0; i < n; i += 256) {
      const int64_t count = std::min<int64_t>(256, n - i);
      if (!in.read(chunk.data(), count * record)) return absl::DataLossError(path + ": read failed");
      for (int64_t r = 0; r < count; ++r) {
        const int64_t label = static_cast<unsigned char>(chunk[r * record + label_offset]);
        if (label >= classes) {
          return absl::DataLossError(absl::StrCat(path, ": record ", i + r, ": label ", label,
                                                  " is not in [0, ", classes, ")"));
        }
        d.labels.push_back(label);
      }
    }
    d.size += n;
    streams.push_back(std::move(in));
  }
  return ReadPart(o, std::move(d), [&](int64_t example, std::vector<uint8_t>& out) -> Status {
    const size_t f = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), example) -
                                         first.begin() - 1);
    std::ifstream& in = streams[f];
    out.resize(kPixels);
    in.seekg((example - first[f]) * record + label_bytes);
    if (!in.read(reinterpret_cast<char*>(out.data()), kPixels)) {
      return absl::DataLossError(absl::StrCat(files[f], ": cannot read record ", example - first[f]));
    }
    return absl::OkStatus();
  });
}

}  // namespace cleave
