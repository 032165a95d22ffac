// Small file helpers with Status errors.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace cleave {

StatusOr<std::string> ReadFile(const std::string& path);
// Writes `data` to `path` atomically: write to a temporary file beside it, fsync it,
// rename over `path`, fsync the directory. A crash leaves the old or the new file.
Status WriteFileAtomic(const std::string& path, std::string_view data);
// Appends one line (a '\n' is added) and flushes it to disk.
Status AppendLine(const std::string& path, std::string_view line);

}  // namespace cleave
