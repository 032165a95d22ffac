// Data sources: what reads "SOURCE:PATH[,OPTION...]" (LoadDataSpec, data/dataset.h) for
// each SOURCE. Sources are a registry (core/registry.h): the built-ins (idx, fmnist,
// folder, cifar10, cifar100, csv, tsv, text) are registered in data/dataset.cc; a source
// of one's own is its own file plus one Add (tests/integration/registration_test.cc
// registers one from the test file alone). LoadDataSpec refuses an option the source does not
// list before calling its loader, then applies the options every source takes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/registry.h"
#include "core/status.h"
#include "data/dataset.h"

namespace cleave {

// The OPTION list of "SOURCE:PATH,OPTION,...": "key=value" or a bare "key" (= "1").
// CheckKnown refuses options a source does not take before anything is loaded, so a
// typo is an error rather than a silently ignored setting.
class SpecOptions {
 public:
  static StatusOr<SpecOptions> Parse(const std::vector<std::string>& items,
                                     const std::string& spec);

  bool Has(const std::string& key);
  std::string String(const std::string& key, const std::string& fallback);
  // An integer in [min, max]; INVALID_ARGUMENT otherwise.
  StatusOr<int64_t> Int(const std::string& key, int64_t fallback, int64_t min, int64_t max);
  // A real number in [min, max]; INVALID_ARGUMENT otherwise.
  StatusOr<double> Double(const std::string& key, double fallback, double min, double max);
  // "A" or "A/B/C": one value or one per channel/feature, each finite (> 0 if positive).
  StatusOr<std::vector<float>> Floats(const std::string& key, std::vector<float> fallback,
                                      bool positive);
  Status CheckKnown(const std::vector<std::string>& known) const;

  // Set by LoadDataSpecPart: the examples to keep. A source that reads only those sets
  // part_taken, having applied `limit` to its index first (as LoadDataSpec applies it
  // before the part is taken); otherwise LoadDataSpecPart takes the part afterwards.
  PartFilter part;
  bool part_taken = false;
  bool offset_taken = false;  // ReadPart applied `offset` to its index

 private:
  std::string spec_;
  std::map<std::string, std::string> values_;
};

// Reads one example's bytes into `out` (replacing what it held). ReadPart asks for
// examples in increasing order, each once.
using ExampleReader = std::function<Status(int64_t example, std::vector<uint8_t>& out)>;

// What a source that can read single examples does: from `index`, the whole data set
// without bytes (its size, labels, targets, groups and every other field), applies
// `limit`, asks the part (SpecOptions::part) which examples it keeps (all when there is
// none), and reads only those, each once, in file order, into their places (an example
// kept twice is copied). With a part, sets o.part_taken: the result equals LoadDataSpec's
// whole set with PartOf taken, while only the part's bytes are ever held.
StatusOr<Dataset> ReadPart(SpecOptions& o, Dataset index, const ExampleReader& read);

// The options ApplyCommonOptions reads.
inline const std::vector<std::string> kCommonOptions = {"offset", "limit", "standardise", "mean", "std",
                                                        "crop", "flip"};

// Options every source takes: offset (leave out the first N examples), limit (then keep
// the first N), standardise, mean, std, crop, flip. Applies them to what a loader returned
// (its mean and std are the source's defaults).
Status ApplyCommonOptions(SpecOptions& o, Dataset& d);

struct DataSource {
  // The options it takes besides kCommonOptions.
  std::vector<std::string> options;
  // Reads PATH: the training part when `train`, else the test part where the source has
  // both. Errors name the file and the entry.
  std::function<StatusOr<Dataset>(const std::string& path, bool train, SpecOptions& options)>
      load;
};

// The sources LoadDataSpec knows, by SOURCE name.
Registry<DataSource>& DataSources();

}  // namespace cleave
