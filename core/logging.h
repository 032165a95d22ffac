// Logging setup: spdlog to stderr, and optionally to a file as well.
#pragma once

#include <string>

namespace cleave {

// Installs the default logger. `file` empty = stderr only. `level`: trace, debug, info,
// warn, error. Safe to call more than once (the last call wins).
void SetupLogging(const std::string& name, const std::string& file = "",
                  const std::string& level = "info");

}  // namespace cleave
