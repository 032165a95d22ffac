// Internal to data/: the loader of each built-in source (registered in dataset.cc).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/dataset.h"
#include "data/source.h"

namespace cleave {

StatusOr<Dataset> LoadIdx(const std::string& dir, bool train, SpecOptions& o);
StatusOr<Dataset> LoadCifar(const std::string& dir, bool train, int classes, SpecOptions& o);
StatusOr<Dataset> LoadTable(const std::string& path, char separator, SpecOptions& o);
StatusOr<Dataset> LoadImageFolder(const std::string& dir, bool train, SpecOptions& o);
StatusOr<Dataset> LoadText(const std::string& path, bool train, SpecOptions& o);
StatusOr<Dataset> LoadInstruct(const std::string& path, bool train, SpecOptions& o);  // instruct.cc

}  // namespace cleave
