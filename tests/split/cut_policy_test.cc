#include "split/cut_policy.h"

#include <gtest/gtest.h>

namespace cleave {
namespace {

// Six stages whose activations shrink with depth while their parameters grow, as in a
// CNN: a deep cut sends little but keeps more on the device.
CutProblem Synthetic(double client_stage_s, double up_bytes_per_s) {
  CutProblem p;
  p.client_stage_s.assign(6, client_stage_s);
  p.server_stage_s.assign(6, 0.001);
  p.input_bytes = {4 * 784};
  p.out_bytes = {32000, 16000, 8000, 4000, 2000, 40};
  p.param_bytes = {1 << 10, 10 << 10, 100 << 10, 1 << 20, 2 << 20, 10 << 10};
  p.batch = 64;
  p.up_bps = up_bytes_per_s;
  p.down_bps = up_bytes_per_s * 4;
  return p;
}

TEST(CutPolicyTest, FastDeviceOnASlowLinkCutsDeep) {
  auto policy = MakeCostModelPolicy();
  auto c = policy->Choose(Synthetic(0.001, 125e3));  // 1 Mbit/s up
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cut, 5);
}

TEST(CutPolicyTest, SlowDeviceOnAFastLinkCutsShallow) {
  auto policy = MakeCostModelPolicy();
  auto c = policy->Choose(Synthetic(0.2, 125e6));  // 1 Gbit/s up, 200 ms per stage
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cut, 1);
}

TEST(CutPolicyTest, TheChoiceMinimisesThePredictedStep) {
  for (double device : {0.0005, 0.005, 0.05}) {
    for (double link : {1e5, 1e6, 1e7, 1e8}) {
      CutProblem p = Synthetic(device, link);
      auto c = MakeCostModelPolicy()->Choose(p);
      ASSERT_TRUE(c.ok());
      for (int cut = 1; cut < 6; ++cut) {
        EXPECT_LE(c->step_s, PredictStep(p, cut).step_s) << device << " " << link << " " << cut;
      }
    }
  }
}

// split.max_reconstruction_ssim: a slow device on a fast link would cut at 1, where the
// server's attack reconstructs best; under the floor it takes the fastest cut whose
// measured SSIM is at or under it, and none when no cut is.
TEST(CutPolicyTest, APrivacyFloorTakesTheFastestCutUnderIt) {
  CutProblem p = Synthetic(0.2, 125e6);
  p.leakage = {-1, 0.74, 0.55, 0.49, 0.41, 0.30};
  auto c = MakeCostModelPolicy()->Choose(p);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cut, 1) << "measured, but no floor";
  EXPECT_DOUBLE_EQ(c->leakage, 0.74);
  p.max_leakage = 0.5;
  EXPECT_FALSE(PredictStep(p, 2).fits);
  EXPECT_NE(PredictStep(p, 2).why_not.find("measures 0.550 at cut 2, above split.max_reconstruction_ssim 0.5"),
            std::string::npos)
      << PredictStep(p, 2).why_not;
  c = MakeCostModelPolicy()->Choose(p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->cut, 3) << "the shallowest, so the fastest, of the cuts under 0.5";
  EXPECT_LE(c->leakage, 0.5);
  p.max_leakage = 0.2;
  EXPECT_EQ(MakeCostModelPolicy()->Choose(p).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CutPolicyTest, ACutOverTheMemoryLimitIsNeverChosen) {
  CutProblem p = Synthetic(0.001, 125e3);  // would cut at 5 without a limit
  p.memory_limit_bytes = 8 << 20;
  ASSERT_GT(PredictStep(p, 5).client_memory_bytes, p.memory_limit_bytes);
  ASSERT_FALSE(PredictStep(p, 5).fits);
  auto c = MakeCostModelPolicy()->Choose(p);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_LT(c->cut, 5);
  EXPECT_LE(c->client_memory_bytes, p.memory_limit_bytes);
  // Of the cuts that fit, it is still the fastest.
  for (int cut = 1; cut < 6; ++cut) {
    const CutPrediction r = PredictStep(p, cut);
    if (r.fits) {
      EXPECT_LE(c->step_s, r.step_s);
    }
  }
  p.memory_limit_bytes = 1000;  // nothing fits
  EXPECT_EQ(MakeCostModelPolicy()->Choose(p).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MakeFixedPolicy(5)->Choose(Synthetic(0.001, 1e6)).value().cut, 5);
  EXPECT_EQ(MakeFixedPolicy(3)->Choose(p).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MakeFixedPolicy(6)->Choose(p).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CutPolicyTest, MemoryCountsFrozenWeightsOptimizerStateAndWhatAutogradKeeps) {
  CutProblem p = Synthetic(0.001, 125e3);
  const int64_t params = (1 << 10) + (10 << 10);
  const int64_t saved_default = 4 * 784 + 32000 + 16000;  // input + outputs of stages 0, 1
  // Defaults: everything trains, SGD with momentum, stage outputs as what is kept.
  EXPECT_EQ(PredictStep(p, 2).client_memory_bytes, 3 * params + 64 * saved_default);
  // A transformer's stages keep far more than their output (attention probabilities):
  // the measured bytes replace the outputs.
  p.saved_bytes = {100000, 400000, 8000, 4000, 2000, 40};
  EXPECT_EQ(PredictStep(p, 2).client_memory_bytes, 3 * params + 64 * (4 * 784 + 500000));
  // Adam's two moments; LoRA: a quarter of each stage trains, the rest is frozen and
  // costs only its values. Two micro-batches in flight: one stashed copy, twice the
  // activations.
  p.optimizer_slots = 2;
  p.trainable_bytes = {256, 2560, 25600, 256 << 10, 512 << 10, 2560};
  p.window = 2;
  EXPECT_EQ(PredictStep(p, 2).client_memory_bytes,
            params + (1 + 2 + 1) * (256 + 2560) + 2 * 64 * (4 * 784 + 500000));
  // U-shaped: the tail's parameters and its input and kept bytes count too.
  p.tail_begin = 5;
  EXPECT_EQ(PredictStep(p, 2).client_memory_bytes,
            params + (10 << 10) + (1 + 2 + 1) * (256 + 2560 + 2560) +
                2 * 64 * (4 * 784 + 500000 + 2000 + 40));
  // With a limit only the frozen-weight accounting lets in, the policy may cut deeper.
  CutProblem full = Synthetic(0.001, 125e3), lora = full;
  lora.trainable_bytes = {16, 160, 1600, 16 << 10, 32 << 10, 160};
  full.memory_limit_bytes = lora.memory_limit_bytes = 8 << 20;
  EXPECT_LT(MakeCostModelPolicy()->Choose(full).value().cut, 5);
  EXPECT_EQ(MakeCostModelPolicy()->Choose(lora).value().cut, 5);
}

TEST(CutPolicyTest, AMicroBatchMustFitOneMessage) {
  CutProblem p = Synthetic(0.2, 125e6);  // prefers cut 1: 64 x 32000 bytes
  p.max_message_bytes = 1 << 20;
  auto c = MakeCostModelPolicy()->Choose(p);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cut, 2);  // 64 x 16000 bytes < 1 MiB
}

TEST(CutPolicyTest, PredictionAddsUpAndWindowsOverlap) {
  CutProblem p = Synthetic(0.01, 1e6);
  p.rtt_s = 0.002;
  const CutPrediction one = PredictStep(p, 2);
  EXPECT_DOUBLE_EQ(one.client_s, 0.02);
  EXPECT_DOUBLE_EQ(one.server_s, 0.004);
  EXPECT_DOUBLE_EQ(one.up_s, (64 * 16000 + 64 * 8) / 1e6);
  EXPECT_DOUBLE_EQ(one.down_s, 64 * 16000 / 4e6);
  EXPECT_DOUBLE_EQ(one.step_s, one.client_s + one.up_s + one.server_s + one.down_s + 0.002);
  p.window = 2;
  const CutPrediction two = PredictStep(p, 2);
  EXPECT_DOUBLE_EQ(two.step_s, std::max(one.up_s, one.step_s / 2));
  EXPECT_GT(two.client_memory_bytes, one.client_memory_bytes);
  // U-shaped: the client also runs the tail, and both exchanges cross the link.
  p.window = 1;
  p.tail_begin = 5;
  const CutPrediction u = PredictStep(p, 2);
  EXPECT_DOUBLE_EQ(u.client_s, 0.03);
  EXPECT_DOUBLE_EQ(u.up_s, (64 * 16000 + 64 * 2000) / 1e6);
}

TEST(CutPolicyTest, FeedbackRescalesTheModelFromMeasuredSteps) {
  CutProblem p = Synthetic(0.01, 1e6);
  const CutPrediction predicted = PredictStep(p, 2);
  CutFeedback f;
  // The device turned out twice as slow, the link 4 times slower, the server as modelled.
  f.Observe(predicted, 2 * predicted.client_s, 4 * (predicted.up_s + predicted.down_s),
            predicted.server_s);
  EXPECT_DOUBLE_EQ(f.client_scale, 2);
  EXPECT_DOUBLE_EQ(f.transfer_scale, 4);
  EXPECT_DOUBLE_EQ(f.server_scale, 1);
  const CutPrediction again = PredictStep(f.Apply(p), 2);
  EXPECT_NEAR(again.client_s, 2 * predicted.client_s, 1e-12);
  EXPECT_NEAR(again.up_s + again.down_s, 4 * (predicted.up_s + predicted.down_s), 1e-12);
  // Smoothed: a second observation moves the scale halfway.
  f.Observe(again, again.client_s / 2, again.up_s + again.down_s, again.server_s);
  EXPECT_DOUBLE_EQ(f.client_scale, 1.5);
}

}  // namespace
}  // namespace cleave
