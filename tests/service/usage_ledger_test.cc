// A site's daily limits (service/usage_ledger.h): what a long-lived client trained over
// the last 24 hours, when a limit is spent and when it frees, kept across restarts; the
// policy keys that set them; and the pause a client sends (service/pool.h CheckPause).
#include "service/usage_ledger.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "service/pool.h"
#include "service/site_policy.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kHour = 3600 * 1000, kDay = UsageLedger::kDayMs, kT0 = 1'800'000'000'000;

class UsageLedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (fs::temp_directory_path() / ("cleave_usage_" + std::to_string(getpid()) + "_" +
                                          ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    fs::remove(path_);
  }
  void TearDown() override { fs::remove(path_); }
  static v1::SitePolicy Policy(const std::string& yaml) { return *ParseSitePolicy(yaml, "p"); }
  std::string path_;
};

TEST_F(UsageLedgerTest, ThreeRoundsADayPauseUntilTheFirstLeavesTheWindowAndSurviveARestart) {
  const v1::SitePolicy policy = Policy("max_rounds_per_day: 3\n");
  ASSERT_TRUE(UsageLedger::Limits(policy));
  StatusOr<UsageLedger> ledger = UsageLedger::Open(path_, policy);  // no file yet
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ledger->PausedAt(kT0 + i * kHour).until_ms, 0) << i;
    ASSERT_TRUE(ledger->Record(kT0 + i * kHour, 60).ok());
  }
  const UsageLedger::Pause p = ledger->PausedAt(kT0 + 2 * kHour);
  EXPECT_EQ(p.until_ms, kT0 + kDay);
  EXPECT_EQ(p.reason, "3 tasks trained in 24 hours, its policy's max_rounds_per_day");
  EXPECT_EQ(ledger->PausedAt(kT0 + kDay).until_ms, 0) << "the first left the window";
  // A restart reads the same tasks back.
  StatusOr<UsageLedger> again = UsageLedger::Open(path_, policy);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->PausedAt(kT0 + 3 * kHour).until_ms, kT0 + kDay);
  // Recording drops what left the window from the file.
  ASSERT_TRUE(again->Record(kT0 + kDay + kHour + 1, 60).ok());
  std::ifstream in(path_);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 2);
}

TEST_F(UsageLedgerTest, AnHourADayPausesUntilEnoughTrainingLeftTheWindow) {
  StatusOr<UsageLedger> ledger = UsageLedger::Open(path_, Policy("max_training_hours_per_day: 1\n"));
  ASSERT_TRUE(ledger.ok());
  ASSERT_TRUE(ledger->Record(kT0, 1800).ok());
  ASSERT_TRUE(ledger->Record(kT0 + kHour, 1200).ok());
  EXPECT_EQ(ledger->PausedAt(kT0 + kHour).until_ms, 0) << "50 minutes";
  ASSERT_TRUE(ledger->Record(kT0 + 2 * kHour, 900).ok());
  // 65 minutes: once the first 30 leave the window (at kT0 + 24 h) 35 are left.
  const UsageLedger::Pause p = ledger->PausedAt(kT0 + 2 * kHour);
  EXPECT_EQ(p.until_ms, kT0 + kDay);
  EXPECT_NE(p.reason.find("max_training_hours_per_day"), std::string::npos) << p.reason;
}

TEST_F(UsageLedgerTest, ALedgerThatDoesNotParseIsRefusedNamingItsLine) {
  std::ofstream(path_) << kT0 << " 60\nnot a task\n";
  StatusOr<UsageLedger> ledger = UsageLedger::Open(path_, Policy("max_rounds_per_day: 3\n"));
  ASSERT_FALSE(ledger.ok());
  EXPECT_EQ(ledger.status().message(), path_ + ":2: not END_UNIX_MS SECONDS");
  // One that is there but cannot be read (a directory) is no empty ledger.
  fs::remove(path_);
  fs::create_directories(path_);
  EXPECT_FALSE(UsageLedger::Open(path_, Policy("max_rounds_per_day: 3\n")).ok());
  fs::remove_all(path_);
}

// Lines out of order (an edited file) are read oldest first.
TEST_F(UsageLedgerTest, LinesAreReadOldestFirst) {
  std::ofstream(path_) << kT0 + 2 * kHour << " 60\n" << kT0 << " 60\n" << kT0 + kHour << " 60\n";
  StatusOr<UsageLedger> ledger = UsageLedger::Open(path_, Policy("max_rounds_per_day: 3\n"));
  ASSERT_TRUE(ledger.ok()) << ledger.status();
  EXPECT_EQ(ledger->PausedAt(kT0 + 3 * kHour).until_ms, kT0 + kDay);
}

TEST_F(UsageLedgerTest, TheDailyKeysAreCheckedWhereThePolicyIsRead) {
  EXPECT_FALSE(UsageLedger::Limits(Policy("max_rounds: 5\n")));
  const v1::SitePolicy p = Policy("max_rounds_per_day: 40\nmax_training_hours_per_day: 2.5\n");
  EXPECT_EQ(p.max_rounds_per_day(), 40);
  EXPECT_EQ(p.max_training_hours_per_day(), 2.5);
  EXPECT_EQ(ParseSitePolicy("max_rounds_per_day: 0\n", "p").status().message(), "p:1: max_rounds_per_day is at least 1");
  EXPECT_EQ(ParseSitePolicy("max_training_hours_per_day: 25\n", "p").status().message(),
            "p:1: max_training_hours_per_day is in (0, 24]");
}

TEST(PoolPauseTest, APauseIsWithinADayAndAnHourOrZero) {
  v1::PoolPause p;
  EXPECT_TRUE(CheckPause(p, kT0).ok()) << "0: resumed";
  p.set_until_unix_ms(kT0 + kDay);
  EXPECT_TRUE(CheckPause(p, kT0).ok());
  p.set_until_unix_ms(kT0 + 26 * kHour);
  EXPECT_EQ(CheckPause(p, kT0).code(), absl::StatusCode::kInvalidArgument);
  p.set_until_unix_ms(-1);
  EXPECT_EQ(CheckPause(p, kT0).code(), absl::StatusCode::kInvalidArgument);
  p.set_until_unix_ms(kT0 + kHour);
  p.set_reason(std::string(600, 'r'));
  EXPECT_EQ(CheckPause(p, kT0).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave
