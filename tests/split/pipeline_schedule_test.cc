// Pipelines held in one process (split/pipeline_schedule.h): each holder's order of
// passes, and one step of the model cut into 2 to 5 holders, in 1 to 8 micro-batches,
// under GPipe and 1F1B, against the uncut model's step.
#include "split/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "tests/models/token_data.h"

namespace cleave {
namespace {

TEST(PipelineScheduleTest, EachHolderRunsEveryPassOnceWithinItsInFlightBound) {
  for (auto schedule : {PipelineSchedule::kGpipe, PipelineSchedule::k1f1b}) {
    for (int holders = 1; holders <= 5; ++holders) {
      for (int m = 1; m <= 8; ++m) {
        for (int h = 0; h < holders; ++h) {
          const std::vector<PipelineOp> ops = PipelineOrder(schedule, holders, h, m);
          ASSERT_EQ(ops.size(), 2u * m);
          std::vector<int> state(m, 0);  // 0 nothing, 1 forward done, 2 backward done
          int in_flight = 0, most = 0;
          for (const PipelineOp& op : ops) {
            ASSERT_EQ(state[op.micro_batch], op.forward ? 0 : 1) << holders << " " << h << " " << m;
            state[op.micro_batch] += 1;
            in_flight += op.forward ? 1 : -1;
            most = std::max(most, in_flight);
          }
          EXPECT_EQ(most, schedule == PipelineSchedule::kGpipe ? m : std::min(m, holders - h))
              << holders << " " << h << " " << m;
        }
      }
    }
  }
}

// One step of a decoder (embedding, 3 blocks, head) cut anywhere into 2 to 5 holders,
// with 1, 2, 4 or 8 micro-batches of a batch of 8 sequences, under either schedule,
// equals the uncut model's: the batch's mean loss, and every weight after a step of SGD
// at learning rate 1 (so each weight's change is its gradient), to 1e-5.
TEST(PipelineScheduleTest, AStepEqualsTheUncutModelsForEveryCutScheduleAndMicroBatchCount) {
  ModelSpec spec;
  spec.name = "gpt";
  spec.seed = 5;
  spec.gpt = {/*vocab=*/61, /*context=*/16, /*layers=*/3, /*heads=*/4, /*dim=*/32, /*tie=*/false};
  const Dataset data = Sequences(RandomIds(8 * 17, 61, 2), 17, 61);
  std::vector<int64_t> all(8);
  for (int i = 0; i < 8; ++i) all[i] = i;
  const Activations input = InputBatch(data, all);
  const std::vector<int64_t> labels = BatchLabels(data, all);
  LocalTrainOptions sgd;
  sgd.optimizer = "sgd";
  sgd.lr = 1.0;
  sgd.momentum = 0;

  auto whole = ModelPart::Create(spec, 0, 5);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const ParameterSet initial = (*whole)->Parameters();
  ASSERT_TRUE((*whole)->ResetOptimizer(sgd).ok());
  auto reference = (*whole)->TrainWithLoss(input, labels);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const ParameterSet expected = (*whole)->Parameters();

  const std::vector<std::vector<int>> cuts = {{0, 2, 5}, {0, 1, 4, 5}, {0, 1, 2, 3, 5}, {0, 1, 2, 3, 4, 5}};
  for (const std::vector<int>& bounds : cuts) {
    for (auto schedule : {PipelineSchedule::kGpipe, PipelineSchedule::k1f1b}) {
      for (int m : {1, 2, 4, 8}) {
        SCOPED_TRACE(::testing::Message() << bounds.size() - 1 << " holders, " << m << " micro-batches, "
                                          << (schedule == PipelineSchedule::kGpipe ? "GPipe" : "1F1B"));
        std::vector<std::unique_ptr<ModelPart>> owned;
        std::vector<ModelPart*> parts;
        for (size_t i = 0; i + 1 < bounds.size(); ++i) {
          auto part = ModelPart::Create(spec, bounds[i], bounds[i + 1]);
          ASSERT_TRUE(part.ok()) << part.status();
          ASSERT_TRUE((*part)->LoadFrom(initial, /*partial=*/true).ok());
          ASSERT_TRUE((*part)->ResetOptimizer(sgd).ok());
          parts.push_back(part->get());
          owned.push_back(*std::move(part));
        }
        auto step = RunLocalPipelineStep(parts, input, labels, m, schedule);
        ASSERT_TRUE(step.ok()) << step.status();
        EXPECT_NEAR(step->loss, reference->loss, 1e-5);
        const int holders = static_cast<int>(parts.size());
        for (int h = 0; h < holders; ++h) {
          EXPECT_EQ(step->max_in_flight[h], schedule == PipelineSchedule::kGpipe ? m : std::min(m, holders - h));
          EXPECT_EQ(parts[h]->pending(), 0u);
          const ParameterSet got = parts[h]->Parameters();
          for (const Tensor& t : got.tensors()) {
            const Tensor& want = *expected.Find(t.name);
            float worst = 0;
            for (size_t i = 0; i < t.values.size(); ++i) worst = std::max(worst, std::fabs(t.values[i] - want.values[i]));
            EXPECT_LE(worst, 1e-5) << t.name;
            // The step moved it: the comparison is of gradients, not of untouched weights.
            if (t.name.find("wte") != std::string::npos) {
              EXPECT_NE(t.values, initial.Find(t.name)->values);
            }
          }
        }
      }
    }
  }
  std::vector<ModelPart*> one = {whole->get()};
  EXPECT_EQ(RunLocalPipelineStep(one, input, labels, 3, PipelineSchedule::k1f1b).status().code(),
            absl::StatusCode::kInvalidArgument);  // 3 does not divide 8
}

// Token-budget micro-batches: longest first, each micro-batch's count x longest within
// the budget, a sequence over it alone, every sequence once.
TEST(PackByTokensTest, PacksLongestFirstWithinTheBudget) {
  EXPECT_EQ(PackByTokens({5, 60, 30, 31, 2, 64}, 64),
            (std::vector<std::vector<int>>{{5}, {1}, {3, 2}, {0, 4}}));
  EXPECT_EQ(PackByTokens({100, 10, 10}, 64), (std::vector<std::vector<int>>{{0}, {1, 2}}));
  EXPECT_EQ(PackByTokens({8, 8, 8, 8}, 16), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_TRUE(PackByTokens({}, 64).empty());
}

}  // namespace
}  // namespace cleave
