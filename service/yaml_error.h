// Errors of the daemon's and the sites' YAML policy files, naming the file and line.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace cleave {

// `name`:LINE: `what`, for 0-based `line` (yaml-cpp's marks).
inline Status FileLineError(const std::string& name, int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ":", line + 1, ": ", what));
}

// `name`:LINE: `what`, the line of YAML node `n`.
inline Status At(const std::string& name, const YAML::Node& n, const std::string& what) {
  return FileLineError(name, n.Mark().line, what);
}

}  // namespace cleave
