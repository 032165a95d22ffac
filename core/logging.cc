#include "core/logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <ctime>
#include <memory>
#include <vector>

namespace cleave {
namespace {

void AppendJsonString(std::string_view s, spdlog::memory_buf_t& out) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out.append(std::string_view("\\\"")); break;
      case '\\': out.append(std::string_view("\\\\")); break;
      case '\n': out.append(std::string_view("\\n")); break;
      case '\r': out.append(std::string_view("\\r")); break;
      case '\t': out.append(std::string_view("\\t")); break;
      default:
        if (c < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", c);
        } else {
          out.push_back(static_cast<char>(c));  // UTF-8 passes through
        }
    }
  }
  out.push_back('"');
}

// JSON lines: {"time":"2026-12-03T10:30:47.123Z","level":"info","logger":"server","thread":123,"msg":"..."}
class JsonFormatter : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto since_epoch = msg.time.time_since_epoch();
    const std::time_t secs = std::chrono::duration_cast<std::chrono::seconds>(since_epoch).count();
    const auto millis = std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() % 1000;
    std::tm utc{};
    gmtime_r(&secs, &utc);
    char time[32];
    std::strftime(time, sizeof(time), "%Y-%m-%dT%H:%M:%S", &utc);
    fmt::format_to(std::back_inserter(dest), "{{\"time\":\"{}.{:03d}Z\",\"level\":\"{}\",\"logger\":",
                   time, static_cast<int>(millis), spdlog::level::to_string_view(msg.level));
    AppendJsonString(std::string_view(msg.logger_name.data(), msg.logger_name.size()), dest);
    fmt::format_to(std::back_inserter(dest), ",\"thread\":{},\"msg\":", msg.thread_id);
    AppendJsonString(std::string_view(msg.payload.data(), msg.payload.size()), dest);
    dest.append(std::string_view("}\n"));
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

}  // namespace

const std::vector<std::string>& LogLevels() {
  static const std::vector<std::string> kLevels = {"trace", "debug", "info", "warn", "error"};
  return kLevels;
}

const std::vector<std::string>& LogFormats() {
  static const std::vector<std::string> kFormats = {"text", "json"};
  return kFormats;
}

Status SetupLogging(const std::string& name, const std::string& file, const std::string& level,
                    const std::string& stderr_level, const std::string& format) {
  const auto& formats = LogFormats();
  if (std::find(formats.begin(), formats.end(), format) == formats.end()) {
    return absl::InvalidArgumentError(absl::StrCat("log format '", format, "' is not text or json"));
  }
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
  if (format == "json") {
    logger->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ [%n] %v");
  }
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace cleave
