// The split-learning modes (split.mode): one list, from which the name table (core/
// names.h) the job checks split.mode against, ParseSplitMode and SplitModeName are read.
#pragma once

#include <string>

#include "core/names.h"
#include "core/status.h"

namespace cleave {

enum class SplitMode { kSl, kSflV1, kSflV2, kUShaped, kPipeline };

struct SplitModeEntry {
  SplitMode mode;
  const char* name;
};
inline constexpr SplitModeEntry kSplitModes[] = {{SplitMode::kSl, "sl"},
                                                 {SplitMode::kSflV1, "sfl-v1"},
                                                 {SplitMode::kSflV2, "sfl-v2"},
                                                 {SplitMode::kUShaped, "ushaped"},
                                                 {SplitMode::kPipeline, "pipeline"}};

inline const NameTable& SplitModeNames() {
  static const NameTable t = [] {
    std::vector<std::string> names;
    for (const SplitModeEntry& m : kSplitModes) names.push_back(m.name);
    return NameTable{"split.mode", names};
  }();
  return t;
}

// INVALID_ARGUMENT naming the modes for a name that is none of them.
inline StatusOr<SplitMode> ParseSplitMode(const std::string& name) {
  for (const SplitModeEntry& m : kSplitModes) {
    if (name == m.name) return m.mode;
  }
  return SplitModeNames().Check(name);
}

inline const char* SplitModeName(SplitMode mode) {
  for (const SplitModeEntry& m : kSplitModes) {
    if (m.mode == mode) return m.name;
  }
  return "?";
}

}  // namespace cleave
