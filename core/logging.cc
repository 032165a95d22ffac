#include "core/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <memory>
#include <vector>

namespace cleave {

const std::vector<std::string>& LogLevels() {
  static const std::vector<std::string> kLevels = {"trace", "debug", "info", "warn", "error"};
  return kLevels;
}

Status SetupLogging(const std::string& name, const std::string& file, const std::string& level,
                    const std::string& stderr_level) {
  const auto& levels = LogLevels();
  for (const std::string& l : {level, stderr_level.empty() ? level : stderr_level}) {
    if (std::find(levels.begin(), levels.end(), l) == levels.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("log level '", l, "' is not one of trace, debug, info, warn, error"));
    }
  }
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (!stderr_level.empty()) sinks.back()->set_level(spdlog::level::from_str(stderr_level));
  if (!file.empty()) {
    try {  // spdlog reports a file it cannot open by throwing
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(file));
    } catch (const spdlog::spdlog_ex& e) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot open the log ", file, ": ", e.what()));
    }
  }
  auto logger = std::make_shared<spdlog::logger>(name, sinks.begin(), sinks.end());
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ [%n] %v");
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace cleave
