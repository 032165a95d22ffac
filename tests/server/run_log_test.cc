// The coordinator's run log: the rounds recorded, and what a resumed run learns from
// its metrics.jsonl.
#include "server/run_log.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "core/files.h"

namespace cleave {
namespace {

RoundMetrics Round(int64_t round, double accuracy) {
  RoundMetrics m;
  m.round = round;
  m.test_accuracy = accuracy;
  return m;
}

TEST(RunLogTest, KeepsRoundsTheLastAccuracyAndTheFinalEvaluation) {
  RunLog log;
  log.Add(Round(1, 0.5));
  log.Add(Round(2, 0.75));
  RoundMetrics final_eval = Round(2, 0);
  final_eval.evaluation_only = true;
  log.Add(final_eval);
  ASSERT_EQ(log.history().size(), 3u);
  EXPECT_EQ(log.history()[1].round, 2);
  EXPECT_EQ(log.last_accuracy(), 0.75);  // a final evaluation has no test accuracy of its own
  EXPECT_EQ(log.final_evaluated_round(), 2);
  EXPECT_FALSE(log.clients_evaluate());
  log.ClientsEvaluate();
  EXPECT_TRUE(log.clients_evaluate());
}

TEST(RunLogTest, AResumedRunDropsRoundsAfterItsCheckpointAndLearnsFromTheRest) {
  const std::string dir = ::testing::TempDir() + "/run_log_test";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/metrics.jsonl";
  ASSERT_TRUE(WriteFileAtomic(path,
                              "{\"round\": 1, \"client_eval\": {\"accuracy\": 0.5}}\n"
                              "{\"round\": 2}\n"
                              "{\"round\": 2, \"evaluation_only\": true}\n"
                              "{\"round\": 3}\n"
                              "not json\n")
                  .ok());
  RunLog log;
  ASSERT_TRUE(log.Resume(path, /*committed_round=*/2).ok());
  EXPECT_TRUE(log.clients_evaluate());
  EXPECT_EQ(log.final_evaluated_round(), 2);
  auto kept = ReadFile(path);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept,
            "{\"round\": 1, \"client_eval\": {\"accuracy\": 0.5}}\n"
            "{\"round\": 2}\n"
            "{\"round\": 2, \"evaluation_only\": true}\n");
  RunLog fresh;
  EXPECT_TRUE(fresh.Resume(dir + "/none.jsonl", 0).ok());  // no metrics yet
  EXPECT_FALSE(fresh.clients_evaluate());
}

}  // namespace
}  // namespace cleave
