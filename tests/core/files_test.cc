#include "core/files.h"

#include <filesystem>
#include <set>

#include <gtest/gtest.h>

namespace cleave {
namespace {

namespace fs = std::filesystem;

std::set<std::string> Names(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

// A run's files: the log appended, the state replaced whole, and once closed nothing
// else in the folder (the spare the next replacement would have used is removed).
TEST(RunFilesTest, ReplacesTheStateAndLeavesNoSpareBehind) {
  const fs::path dir = fs::temp_directory_path() / "cleave_run_files_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    auto f = RunFiles::Open(dir.string(), "metrics.jsonl", "checkpoint.pb");
    ASSERT_TRUE(f.ok()) << f.status();
    ASSERT_TRUE((*f)->AppendLog("{\"round\": 1}").ok());
    ASSERT_TRUE((*f)->ReplaceState("first, longer state").ok());
    ASSERT_TRUE((*f)->AppendLog("{\"round\": 2}").ok());
    ASSERT_TRUE((*f)->ReplaceState("second").ok());
    EXPECT_EQ(*ReadFile((dir / "checkpoint.pb").string()), "second");
    EXPECT_TRUE(fs::exists(dir / "checkpoint.pb.tmp"));  // opened ahead of the next replacement
  }
  EXPECT_EQ(Names(dir), (std::set<std::string>{"checkpoint.pb", "metrics.jsonl"}));
  EXPECT_EQ(*ReadFile((dir / "metrics.jsonl").string()), "{\"round\": 1}\n{\"round\": 2}\n");
  EXPECT_EQ(*ReadFile((dir / "checkpoint.pb").string()), "second");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cleave
