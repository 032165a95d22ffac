// What the three binaries' command lines share (CLI11, header-only).
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "core/logging.h"

namespace cleave {

// Accepts a whole number >= 1 ("--rounds 0" or "-4" is an error naming the flag).
inline CLI::Validator AtLeastOne() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          size_t used = 0;
          const long long v = std::stoll(s, &used);
          if (used == s.size() && v >= 1) return "";
        } catch (const std::exception&) {
        }
        return "must be a whole number >= 1, not '" + s + "'";
      },
      "INT>=1", "AtLeastOne");
}

// Parses the command line. Returns -1 to go on, or the exit code: 0 after --help, 2
// after printing what is wrong (docs: exit code 2 is bad configuration or arguments).
inline int ParseCommandLine(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return -1;
}

// --log-level and --log-format, as cleave-server and cleave-client take them.
inline void AddLogOptions(CLI::App& app, std::string* level, std::string* format) {
  app.add_option("--log-level", *level, "trace|debug|info|warn|error")
      ->check(CLI::IsMember(LogLevels()));
  app.add_option("--log-format", *format,
                 "text, or json: one JSON object per line (time, level, logger, thread, msg)")
      ->check(CLI::IsMember(LogFormats()));
}

}  // namespace cleave
