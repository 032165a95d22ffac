// Internal to data/: the options of a data spec and the loader of each source.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

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

 private:
  std::string spec_;
  std::map<std::string, std::string> values_;
};

// The options ApplyCommonOptions reads.
inline const std::vector<std::string> kCommonOptions = {"limit", "standardise", "mean", "std",
                                                        "crop", "flip"};

// Options every source takes: limit, standardise, mean, std, crop, flip. Applies them
// to what a loader returned (its mean and std are the source's defaults).
Status ApplyCommonOptions(SpecOptions& o, Dataset& d);

StatusOr<Dataset> LoadIdx(const std::string& dir, bool train, SpecOptions& o);
StatusOr<Dataset> LoadCifar(const std::string& dir, bool train, int classes, SpecOptions& o);
StatusOr<Dataset> LoadTable(const std::string& path, char separator, SpecOptions& o);
StatusOr<Dataset> LoadImageFolder(const std::string& dir, bool train, SpecOptions& o);
StatusOr<Dataset> LoadText(const std::string& path, bool train, SpecOptions& o);

}  // namespace cleave
