// The coordinator's traffic meter: a round's counts start from zero, compression's
// savings make the fp32 figures, committed rounds add up to the run's bytes (restored
// from a checkpoint), and the process's counters never reset.
#include "server/traffic_meter.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace cleave {
namespace {

TEST(TrafficMeterTest, ARoundCountsItsOwnBytesAndWhatCompressionSaved) {
  TrafficMeter t;
  t.Up(100);
  t.Down(40);
  t.SavedUp(300);
  t.SavedDown(-4);  // a codec that grew a tensor
  t.AcceptedUpdate(90);
  TrafficMeter::Round r = t.RoundSoFar();
  EXPECT_EQ(r.up, 100);
  EXPECT_EQ(r.down, 40);
  EXPECT_EQ(r.up_fp32, 400);
  EXPECT_EQ(r.down_fp32, 36);
  EXPECT_EQ(r.updates, 90);

  t.StartRound();
  t.Up(7);
  r = t.RoundSoFar();
  EXPECT_EQ(r.up, 7);
  EXPECT_EQ(r.down, 0);
  EXPECT_EQ(r.up_fp32, 7);
  EXPECT_EQ(r.down_fp32, 0);
  EXPECT_EQ(r.updates, 0);
  // The process's counters keep every byte.
  EXPECT_EQ(t.lifetime_up(), 107);
  EXPECT_EQ(t.lifetime_down(), 40);
}

TEST(TrafficMeterTest, CommittedRoundsAddUpAndAResumedRunStartsFromItsCheckpoint) {
  TrafficMeter t;
  t.Commit(100, 40);
  t.Commit(5, 6);
  EXPECT_EQ(t.run_up(), 105);
  EXPECT_EQ(t.run_down(), 46);
  TrafficMeter resumed;
  resumed.RestoreRun(t.run_up(), t.run_down());
  resumed.Commit(1, 2);
  EXPECT_EQ(resumed.run_up(), 106);
  EXPECT_EQ(resumed.run_down(), 48);
  EXPECT_EQ(resumed.lifetime_up(), 0);  // restoring is not traffic
}

TEST(TrafficMeterTest, CountsFromManyThreadsAreNotLost) {
  TrafficMeter t;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 10000; ++j) {
        t.Up(3);
        t.Down(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(t.RoundSoFar().up, 120000);
  EXPECT_EQ(t.lifetime_down(), 40000);
}

}  // namespace
}  // namespace cleave
