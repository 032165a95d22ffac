// Logging setup: spdlog to stderr, and optionally to a file as well.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace cleave {

// The levels SetupLogging accepts, in order: trace, debug, info, warn, error.
const std::vector<std::string>& LogLevels();
// Its formats: text (one line per message) and json (one JSON object per line: "time"
// in UTC with milliseconds, "level", "logger", "thread" and "msg").
const std::vector<std::string>& LogFormats();

// Installs the default logger. `file` empty = stderr only. `level`: one of LogLevels();
// `stderr_level`, when set, is a higher one for stderr alone (the file keeps `level`).
// INVALID_ARGUMENT for another level and FAILED_PRECONDITION when `file` cannot be
// opened (a read-only run directory), leaving the previous logger in place. Safe to
// call more than once (the last call wins). `format`: one of LogFormats(), for every sink.
Status SetupLogging(const std::string& name, const std::string& file = "",
                    const std::string& level = "info", const std::string& stderr_level = "",
                    const std::string& format = "text");

}  // namespace cleave
