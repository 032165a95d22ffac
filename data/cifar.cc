// The CIFAR-10 and CIFAR-100 binary formats (https://www.cs.toronto.edu/~kriz/cifar.html):
// records of label byte(s) then 3072 pixel bytes, red plane, green plane, blue plane.
#include <sys/stat.h>

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
  const int64_t record = label_bytes + kPixels;
  for (size_t f = 0; f < files.size(); ++f) {
    ASSIGN_OR_RETURN(std::string bytes, ReadFile(files[f]));
    if (bytes.empty() || bytes.size() % record != 0) {
      return absl::DataLossError(absl::StrCat(files[f], ": ", bytes.size(),
                                              " bytes is not a whole number of ", record,
                                              "-byte CIFAR records"));
    }
    const int64_t n = static_cast<int64_t>(bytes.size()) / record;
    d.bytes.reserve(d.bytes.size() + n * kPixels);
    for (int64_t i = 0; i < n; ++i) {
      const char* r = bytes.data() + i * record;
      const int64_t label = static_cast<unsigned char>(r[label_offset]);
      if (label >= classes) {
        return absl::DataLossError(absl::StrCat(files[f], ": record ", i, ": label ", label,
                                                " is not in [0, ", classes, ")"));
      }
      d.labels.push_back(label);
      d.bytes.insert(d.bytes.end(), r + label_bytes, r + record);
    }
    d.size += n;
  }
  return d;
}

}  // namespace cleave
