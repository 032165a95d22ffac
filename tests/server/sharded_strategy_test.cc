// The strategy's shards: upload workers and other threads add at once, each into its own
// partial sum, and the round is their exact weighted mean; State waits for none.
#include "server/rounds/sharded_strategy.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "job/job.h"

namespace cleave {
namespace {

ParameterSet Vec(float a, float b) {
  ParameterSet ps;
  EXPECT_TRUE(ps.Add({"w", {2}, {a, b}}).ok());
  return ps;
}

TEST(ShardedStrategyTest, WorkersAndOtherThreadsAddAtOnceIntoAnExactMean) {
  auto job = ParseJob("strategy: {name: fedavg}", "");
  ASSERT_TRUE(job.ok()) << job.status();
  auto fedavg = CreateStrategy(StrategyJobOf(*job));
  ASSERT_TRUE(fedavg.ok()) << fedavg.status();
  ShardedStrategy s(/*workers=*/3);
  EXPECT_EQ(s.shards(), 4);
  s.Set(*std::move(fedavg));

  ParameterSet global = Vec(10, 20);
  s.BeginRound(global);
  // Worker w (and -1, a thread outside the pool) adds 50 updates of (w + 2, -(w + 2)),
  // each of weight 2: the mean is (1 + 2 + 3 + 4) / 4 = 2.5 each way.
  std::vector<std::thread> threads;
  for (int w : {0, 1, 2, -1}) {
    threads.emplace_back([&s, w] {
      const float v = static_cast<float>(w + 2);
      const std::string bytes = Vec(v, -v).Encode();
      for (int i = 0; i < 50; ++i) {
        auto views = ParseParameterSet(bytes);
        ASSERT_TRUE(views.ok());
        s.Accumulate(ClientUpdate::Unnamed(*views, 2), w);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(s.get().accumulated(), 200);
  ASSERT_TRUE(s.get().FinishRound(0, &global).ok());
  EXPECT_FLOAT_EQ(global.tensors()[0].values[0], 12.5f);
  EXPECT_FLOAT_EQ(global.tensors()[0].values[1], 17.5f);
  EXPECT_EQ(s.State().size(), s.get().State().size());
}

}  // namespace
}  // namespace cleave
