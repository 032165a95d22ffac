// Untrusted JSON (core/json.h) and bounded file reads (core/files.h): deep nesting,
// NaN, numbers past a double and files that are not regular or too large are refused
// with the parser's or the reader's own words, naming what was read.
#include "core/json.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/files.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

TEST(ParseJsonTest, RefusesDepthAndWhatPythonWritesButJsonIsNot) {
  EXPECT_TRUE(ParseJson(std::string(64, '[') + std::string(64, ']'), "x").ok());
  auto deep = ParseJson(std::string(65, '[') + std::string(65, ']'), "x.json");
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().message(), "x.json: arrays and objects nested more than 64 deep");
  auto million = ParseJson(std::string(1000000, '[') + std::string(1000000, ']'), "x.json");
  EXPECT_FALSE(million.ok());
  auto nan = ParseJsonObject(R"({"a": NaN})", "c.json");
  ASSERT_FALSE(nan.ok());
  EXPECT_NE(nan.status().message().find("c.json: not valid JSON"), std::string::npos) << nan.status();
  EXPECT_NE(nan.status().message().find("NaN and Infinity are not JSON numbers"), std::string::npos);
  auto huge = ParseJsonObject(R"({"a": 1e999})", "c.json");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("1e999"), std::string::npos) << huge.status();
  auto list = ParseJsonObject("[1]", "c.json");
  ASSERT_FALSE(list.ok());
  EXPECT_EQ(list.status().message(), "c.json: not a JSON object");
}

TEST(ReadBoundedFileTest, ReadsRegularFilesWithinTheLimitOnly) {
  const std::string dir = (fs::temp_directory_path() / "cleave_bounded_read").string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir + "/small") << "0123456789";
  EXPECT_EQ(*ReadBoundedFile(dir + "/small", 10), "0123456789");
  auto big = ReadBoundedFile(dir + "/small", 9);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("holds 10 bytes, over the limit of 9"), std::string::npos) << big.status();
  fs::create_symlink("/dev/zero", dir + "/zero");
  auto zero = ReadBoundedFile(dir + "/zero", 1 << 20);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("is not a regular file"), std::string::npos) << zero.status();
  EXPECT_EQ(ReadBoundedFile(dir, 1 << 20).status().code(), absl::StatusCode::kInvalidArgument);  // a directory
  EXPECT_EQ(ReadBoundedFile(dir + "/none", 1 << 20).status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cleave
