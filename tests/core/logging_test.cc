// SetupLogging: text or JSON lines, to stderr and a file.
#include "core/logging.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace cleave {
namespace {

TEST(LoggingTest, JsonLinesAreOneObjectPerMessageWithWhatItSaid) {
  const std::string file = std::filesystem::temp_directory_path() /
                           ("cleave-log-" + std::to_string(getpid()) + ".jsonl");
  std::filesystem::remove(file);
  ASSERT_TRUE(SetupLogging("server", file, "debug", "error", "json").ok());
  spdlog::info("client {} joined", "a\"b\\c\nd\x01");
  spdlog::debug("round {}", 3);
  spdlog::trace("below the level");
  spdlog::default_logger()->flush();
  ASSERT_TRUE(SetupLogging("test").ok());  // releases the file

  std::ifstream in(file);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    lines.push_back(j);
  }
  std::filesystem::remove(file);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["msg"], "client a\"b\\c\nd\x01 joined");
  EXPECT_EQ(lines[0]["level"], "info");
  EXPECT_EQ(lines[0]["logger"], "server");
  EXPECT_TRUE(lines[0]["thread"].is_number());
  const std::string time = lines[0]["time"];  // 2026-12-03T10:30:47.123Z
  ASSERT_EQ(time.size(), 24u) << time;
  EXPECT_EQ(time[10], 'T');
  EXPECT_EQ(time[19], '.');
  EXPECT_EQ(time.back(), 'Z');
  EXPECT_EQ(lines[1]["msg"], "round 3");
  EXPECT_EQ(lines[1]["level"], "debug");
}

TEST(LoggingTest, UnknownFormatsAndLevelsAreRefused) {
  EXPECT_EQ(SetupLogging("x", "", "info", "", "xml").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SetupLogging("x", "", "loud").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave
