// The pipeline planner (split/pipeline_plan.h): its cost model against hand-computed
// values, its refusals, and its plans against an exhaustive search.
#include "split/pipeline_plan.h"

#include <gtest/gtest.h>

#include <random>

namespace cleave {
namespace {

// A model of `n` equal stages (a decoder's blocks), 1 MB of activations a sample
// between them, 10 MB of parameters each.
CutProblem Blocks(int n, double stage_s) {
  CutProblem p;
  p.client_stage_s.assign(n, stage_s);
  p.server_stage_s.assign(n, stage_s / 10);
  p.input_bytes = {256};
  p.out_bytes.assign(n, 1 << 20);
  p.param_bytes.assign(n, 10 << 20);
  p.batch = 8;
  p.optimizer_slots = 2;
  return p;
}

TEST(PipelinePlanTest, PredictsTheFillDrainAndSlowestResource) {
  PipelineProblem p;
  p.model = Blocks(4, 0.0);
  p.model.client_stage_s = {1, 2, 3, 4};
  p.model.server_stage_s = {9, 9, 9, 0.5};
  p.model.out_bytes = {100, 200, 300, 400};
  p.model.batch = 4;
  p.devices = {{"owner", 1, 1000, 2000, 0.01, 0}, {"laptop", 2, 4000, 500, 0.02, 0}};
  auto plan = PredictPipeline(p, PipelinePlan::Of({0, 1}, {0, 1, 3}, 2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Two micro-batches of two samples. The owner: stage 0, 1 s a batch, half a micro-batch.
  // Hop 0: 100 B x 2 forward over min(1000 up, 500 down) = 0.4 s; back over
  // min(4000, 2000) = 0.1 s; the slower direction. The laptop (twice as fast): stages 1
  // and 2, 5 / 2 / 2. Hop 1 to the server: 300 x 2 over the laptop's 4000 up (0.15 s),
  // back over its 500 down (1.2 s). The server: stage 3, 0.5 / 2.
  const std::vector<double> expected = {0.5, 0.4, 1.25, 1.2, 0.25};
  ASSERT_EQ(plan->resource_s.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_DOUBLE_EQ(plan->resource_s[i], expected[i]) << i;
  EXPECT_DOUBLE_EQ(plan->bottleneck_s, 1.25);
  // Fill and drain (3.6 s), one more micro-batch at the bottleneck, two round trips a hop.
  EXPECT_DOUBLE_EQ(plan->step_s, 3.6 + 1.25 + 2 * 0.02 + 2 * 0.02);
  EXPECT_DOUBLE_EQ(plan->busy[1], 2 * 1.25 / plan->step_s);
}

// U-shaped (split.ushaped): the owner also computes and holds the head, and every hop
// carries the head's input down and its gradient up besides the cut's tensors.
TEST(PipelinePlanTest, AUShapedChainCountsTheHeadOnTheOwnerAndOnEveryHop) {
  PipelineProblem p;
  p.model = Blocks(5, 0.0);
  p.model.client_stage_s = {1, 2, 3, 4, 6};
  p.model.server_stage_s = {9, 9, 9, 0.5, 9};
  p.model.out_bytes = {100, 200, 300, 400, 10};
  p.model.batch = 4;
  p.model.tail_begin = 4;
  p.devices = {{"owner", 1, 1000, 2000, 0.01, 0}, {"laptop", 2, 4000, 500, 0.02, 0}};
  auto plan = PredictPipeline(p, PipelinePlan::Of({0, 1}, {0, 1, 3}, 2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The owner: stages 0 and 4, (1 + 6) / 2. Hop 0: 100 x 2 of activations and 400 x 2 of
  // the head's gradient up, over min(1000, 500): 2 s; as much down over min(4000, 2000):
  // 0.5 s. The laptop as before, 1.25. Hop 1: 1,400 B each way, up over 4000 (0.35 s),
  // down over 500: 2.8 s. The server: stage 3 only.
  const std::vector<double> expected = {3.5, 2.0, 1.25, 2.8, 0.25};
  ASSERT_EQ(plan->resource_s.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_DOUBLE_EQ(plan->resource_s[i], expected[i]) << i;
  // Each hop is crossed twice each way: four round trips.
  EXPECT_DOUBLE_EQ(plan->step_s, 9.8 + 3.5 + 4 * 0.02 + 4 * 0.02);
  PipelineProblem line = p;
  line.model.tail_begin = -1;
  auto without = PredictPipeline(line, PipelinePlan::Of({0, 1}, {0, 1, 3}, 2));
  ASSERT_TRUE(without.ok());
  EXPECT_GT(plan->memory_bytes[0], without->memory_bytes[0]);  // the head's parameters
  EXPECT_EQ(plan->memory_bytes[1], without->memory_bytes[1]);
  // The server must keep a stage before the head.
  EXPECT_EQ(PredictPipeline(p, PipelinePlan::Of({0, 1}, {0, 1, 4}, 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PipelinePlanTest, RefusesIllFormedPlansAndNamesTheDeviceOverItsMemory) {
  PipelineProblem p;
  p.model = Blocks(6, 0.1);
  p.devices = {{"owner"}, {"phone"}, {"tablet"}};
  auto code = [&](PipelinePlan plan) { return PredictPipeline(p, plan).status().code(); };
  EXPECT_EQ(code(PipelinePlan::Of({1, 0}, {0, 2, 4}, 1)), absl::StatusCode::kInvalidArgument);     // owner not first
  EXPECT_EQ(code(PipelinePlan::Of({0, 1, 1}, {0, 1, 2, 3}, 1)), absl::StatusCode::kInvalidArgument);  // a device twice
  EXPECT_EQ(code(PipelinePlan::Of({0, 1}, {0, 3, 3}, 1)), absl::StatusCode::kInvalidArgument);     // one holds nothing
  EXPECT_EQ(code(PipelinePlan::Of({0, 1}, {0, 3, 6}, 1)), absl::StatusCode::kInvalidArgument);     // the server holds nothing
  EXPECT_EQ(code(PipelinePlan::Of({0, 1}, {0, 3, 5}, 3)), absl::StatusCode::kInvalidArgument);     // 3 does not divide 8
  EXPECT_EQ(code(PipelinePlan::Of({0, 7}, {0, 3, 5}, 1)), absl::StatusCode::kInvalidArgument);     // no such device
  // A stage: 10 MiB of weights, as much again of gradient and of each Adam moment, and
  // 1 MiB of activations for each of the batch's 8 samples: 48 MiB.
  p.devices[1].memory_limit_bytes = 60 << 20;
  auto over = PredictPipeline(p, PipelinePlan::Of({0, 1}, {0, 1, 5}, 1));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(over.status().message().find("device phone would need"), std::string::npos) << over.status();
  EXPECT_TRUE(PredictPipeline(p, PipelinePlan::Of({0, 1}, {0, 4, 5}, 1)).ok());
}

// A fast helper takes most of the stages from a slow owner; a device slower than the
// owner and behind a slow link is left out; memory limits are kept.
TEST(PipelinePlanTest, PlacesStagesWhereTheyRunFastestWithinMemory) {
  PipelineProblem p;
  p.model = Blocks(12, 0.2);
  p.model.server_stage_s.assign(12, 0.2);  // a server busy with other chains
  p.devices = {{"owner", 1, 50e6, 50e6}, {"laptop", 10, 50e6, 50e6}, {"watch", 0.2, 1e5, 1e5}};
  auto plan = PlanPipeline(p);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->chain, (std::vector<int>{0, 1}));
  EXPECT_GT(plan->bounds[2] - plan->bounds[1], 3 * (plan->bounds[1] - plan->bounds[0]));
  p.devices[1].memory_limit_bytes = 250 << 20;
  auto limited = PlanPipeline(p);
  ASSERT_TRUE(limited.ok()) << limited.status();
  for (size_t i = 0; i < limited->chain.size(); ++i) {
    const int64_t limit = p.devices[limited->chain[i]].memory_limit_bytes;
    if (limit > 0) {
      EXPECT_LE(limited->memory_bytes[i], limit);
    }
  }
  EXPECT_GE(limited->step_s, plan->step_s);
  for (auto& d : p.devices) d.memory_limit_bytes = 1 << 20;  // not even one stage fits
  EXPECT_EQ(PlanPipeline(p).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Under GPipe every micro-batch of the batch stays in flight on every device; under 1F1B
// a device keeps at most as many as there are holders after it, so a tight memory
// limit allows more micro-batches.
TEST(PipelinePlanTest, OneForwardOneBackwardKeepsFewerMicroBatches) {
  PipelineProblem p;
  p.model = Blocks(8, 0.1);
  p.model.batch = 16;
  p.devices = {{"owner"}, {"phone"}};
  const PipelinePlan plan = PipelinePlan::Of({0, 1}, {0, 3, 6}, 16);
  p.schedule = PipelineSchedule::kGpipe;
  auto gpipe = PredictPipeline(p, plan);
  p.schedule = PipelineSchedule::k1f1b;
  auto one = PredictPipeline(p, plan);
  ASSERT_TRUE(gpipe.ok() && one.ok());
  // One micro-batch keeps 3 stages x 1 MiB x 1 sample (+ the input on the owner).
  EXPECT_EQ(gpipe->memory_bytes[1] - one->memory_bytes[1], (16 - 2) * int64_t{3} << 20);
  EXPECT_EQ(gpipe->memory_bytes[0] - one->memory_bytes[0], (16 - 3) * (int64_t{3} * (1 << 20) + 256));
  EXPECT_DOUBLE_EQ(gpipe->step_s, one->step_s);
}

// On random small cases with a 10x spread of compute and of links, the planner's plan
// is within 1.10x of the best an exhaustive search finds (and never better: that one is
// optimal for the model), and never over a device's memory.
TEST(PipelinePlanTest, PlansWithinTenPercentOfTheExhaustiveBest) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> log10x(0, 1);
  double worst = 1;
  for (int trial = 0; trial < 30; ++trial) {
    PipelineProblem p;
    const int n = 6 + trial % 5;
    p.model = Blocks(n, 0.05);
    for (auto& t : p.model.client_stage_s) t *= std::pow(10, log10x(rng) * 0.5);
    p.model.batch = 8;
    p.micro_batches = {1, 2, 4, 8};
    p.max_devices = 3;
    for (int d = 0; d < 4; ++d) {
      ChainDevice dev;
      dev.name = "d" + std::to_string(d);
      dev.speed = std::pow(10, log10x(rng));
      dev.up_bps = 2e6 * std::pow(10, log10x(rng));
      dev.down_bps = 4 * dev.up_bps;
      dev.memory_limit_bytes = trial % 3 == 0 ? int64_t{400} << 20 : 0;
      p.devices.push_back(dev);
    }
    // A fixed split.cut: the server's stages start there, and the chain is exactly as
    // long as split.devices.
    if (trial % 2 == 1) {
      p.server_begin = n - 2;
      p.min_devices = p.max_devices;
    }
    if (trial % 4 == 2) p.model.tail_begin = n - 1;  // U-shaped
    auto plan = PlanPipeline(p);
    auto best = PlanPipelineExhaustively(p);
    ASSERT_EQ(plan.ok(), best.ok()) << trial;
    if (!best.ok()) continue;
    if (p.server_begin > 0) {
      EXPECT_EQ(plan->bounds.back(), p.server_begin) << trial;
      EXPECT_EQ(static_cast<int>(plan->chain.size()), p.min_devices) << trial;
      // The even split (split.plan: even) shares the same stages and is never better.
      if (auto even = EqualSplitPlan(p, 2); even.ok()) {
        EXPECT_EQ(even->bounds.back(), p.server_begin) << trial;
        EXPECT_GE(even->step_s, best->step_s * (1 - 1e-12)) << trial;
      }
    }
    EXPECT_GE(plan->step_s, best->step_s * (1 - 1e-12)) << trial;
    EXPECT_LE(plan->step_s, 1.10 * best->step_s) << trial;
    worst = std::max(worst, plan->step_s / best->step_s);
    for (size_t i = 0; i < plan->chain.size(); ++i) {
      const int64_t limit = p.devices[plan->chain[i]].memory_limit_bytes;
      if (limit > 0) {
        EXPECT_LE(plan->memory_bytes[i], limit) << trial;
      }
    }
  }
  RecordProperty("worst_ratio", std::to_string(worst));
}

}  // namespace
}  // namespace cleave
