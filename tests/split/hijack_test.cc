// A malicious server's feature-space hijacking (FeatureSpaceHijack, models/inversion.h)
// against a LeNet-5 client part at its first cut, on Fashion-MNIST, and the device's
// SplitGuard (privacy/split_guard.h): the hijack makes the device's own activations
// invertible, and the guard tells the hijack's gradients from an honest server's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "data/dataset.h"
#include "models/inversion.h"
#include "privacy/split_guard.h"
#include "split/attacks.h"

namespace cleave {
namespace {

// The device's side: its part [0, cut) of LeNet-5 with plain SGD (the job's default).
class HijackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetTorchThreads(1);
    auto test = LoadFashionMnist("/usr/share/datasets/fashion-mnist", /*train=*/false, 2000);
    auto train = LoadFashionMnist("/usr/share/datasets/fashion-mnist", /*train=*/true, 3000);
    ASSERT_TRUE(test.ok() && train.ok());
    device_ = *train;
    std::vector<int64_t> aux(test->size);
    std::iota(aux.begin(), aux.end(), 0);
    aux_ = InputBatch(*test, aux);
    spec_.name = "lenet5";
    spec_.seed = 1;
    SetInputRange(device_, &range_);
  }

  std::unique_ptr<ModelPart> Part(int begin, int end) {
    auto p = ModelPart::Create(spec_, begin, end);
    EXPECT_TRUE(p.ok()) << p.status();
    LocalTrainOptions o;
    o.lr = 0.05;
    EXPECT_TRUE((*p)->ResetOptimizer(o).ok());
    return *std::move(p);
  }

  std::vector<int64_t> Batch(int64_t step, int size) const {
    std::vector<int64_t> idx(static_cast<size_t>(size));
    for (int i = 0; i < size; ++i) idx[i] = (step * size + i) % device_.size;
    return idx;
  }
  // Trains the client part [0, cut) for `steps` micro-batches of 32 against an honest
  // server part (the labels) or the hijack, the guard watching (with `threshold`);
  // returns the guard's refusal (OK: none) and leaves the client part in `client`.
  // With `honest_steps`, the server trains honestly that long before it hijacks.
  Status Train(int cut, FeatureSpaceHijack* hijack, int steps, uint64_t seed, std::unique_ptr<ModelPart>* client,
               double threshold = SplitGuardOptions().threshold, int honest_steps = 0) {
    *client = Part(0, cut);
    std::unique_ptr<ModelPart> server = Part(cut, 5);
    SplitGuardOptions go;
    go.enabled = true;
    go.seed = seed;
    go.threshold = threshold;
    SplitGuard guard(go);
    for (int step = 0; step < steps; ++step) {
      const std::vector<int64_t> idx = Batch(step, 32);
      std::vector<int64_t> labels = BatchLabels(device_, idx);
      ASSIGN_OR_RETURN(Activations z, (*client)->Forward(step, InputBatch(device_, idx)));
      const bool fake = guard.NextIsFake();
      if (fake) guard.Fake(10, &labels);
      Activations grad;
      if (hijack != nullptr && step >= honest_steps) {
        ASSIGN_OR_RETURN(FeatureSpaceHijack::Step s, hijack->Train(z));
        grad = std::move(s.grad);
      } else {
        ASSIGN_OR_RETURN(ModelPart::LossStep s, server->TrainWithLoss(z, labels));
        grad = std::move(s.grad_in);
      }
      ASSIGN_OR_RETURN(ModelPart::Probe p, (*client)->BackwardProbe(step, grad, !fake));
      RETURN_IF_ERROR(guard.Add(fake, p.first_gradient));
    }
    return absl::OkStatus();
  }

  HijackOptions Options() const {
    HijackOptions o;
    o.lo = range_.lo, o.hi = range_.hi;
    o.hidden = 256;  // smaller and quicker than the server's own
    return o;
  }

  ModelSpec spec_;
  Dataset device_;
  Activations aux_;
  InversionOptions range_;
};

// Pasquini et al.'s result on our setting: after 900 hijacked steps the
// server's decoder turns the device's activations of images it never saw back into
// them, far better than guessing the mean image, and better than its decoder did
// before the client part trained.
TEST_F(HijackTest, TheHijackedPartFeedsTheServersDecoder) {
  auto hijack = FeatureSpaceHijack::Create(spec_, 1, aux_, Options());
  ASSERT_TRUE(hijack.ok()) << hijack.status();
  const std::vector<int64_t> held = {2990, 2991, 2992, 2993, 2994, 2995, 2996, 2997};  // never trained on
  const Activations x = InputBatch(device_, held);
  const auto ssim_of_reconstruction = [&](ModelPart& client) {
    auto z = client.Forward(-1, x);
    EXPECT_TRUE(z.ok());
    auto rec = (*hijack)->Reconstruct(*z);
    EXPECT_TRUE(rec.ok()) << rec.status();
    EXPECT_TRUE(client.BackwardProbe(-1, *z, /*step=*/false).ok());
    return MeanSsim(x.values, rec->values, x.batch(), {1, 28, 28}, device_);
  };
  std::unique_ptr<ModelPart> client = Part(0, 1);
  const double before = ssim_of_reconstruction(*client);
  ASSERT_TRUE(Train(1, hijack->get(), 900, 1, &client, /*threshold=*/0).ok());  // a guard that never refuses
  const double after = ssim_of_reconstruction(*client);
  // The mean image's SSIM: what guessing without the activations gets.
  std::vector<float> mean(784, 0.0f);
  for (int64_t i = 0; i < aux_.batch(); ++i) {
    for (int p = 0; p < 784; ++p) mean[p] += aux_.values[i * 784 + p] / static_cast<float>(aux_.batch());
  }
  std::vector<float> guess;
  for (int64_t i = 0; i < x.batch(); ++i) guess.insert(guess.end(), mean.begin(), mean.end());
  const double baseline = MeanSsim(x.values, guess, x.batch(), {1, 28, 28}, device_);
  EXPECT_GT(after, 0.3);
  EXPECT_GT(after, baseline + 0.15);
  EXPECT_GT(after, before + 0.2);
}

// With its defaults (a fake in 20, half its labels moved, a verdict after 10), the
// guard refuses the hijack within 500 micro-batches, at the first cut and a deep one,
// and lets an honest server train on.
TEST_F(HijackTest, TheGuardRefusesTheHijackAndNotAnHonestServer) {
  for (int cut : {1, 3}) {
    std::unique_ptr<ModelPart> client;
    EXPECT_TRUE(Train(cut, nullptr, 500, /*seed=*/1, &client).ok()) << "honest server, cut " << cut;
    auto hijack = FeatureSpaceHijack::Create(spec_, cut, aux_, Options());
    ASSERT_TRUE(hijack.ok()) << hijack.status();
    Status s = Train(cut, hijack->get(), 500, /*seed=*/1, &client);
    EXPECT_TRUE(IsSplitGuardVerdict(s)) << "hijack at cut " << cut << ": " << s;
    EXPECT_NE(s.message().find("training hijacking suspected"), std::string::npos) << s;
  }
}

// A server that trains honestly for 600 micro-batches and then hijacks: the guard's
// evidence fades (SplitGuardOptions::memory), so it is judged on what it does now and
// refused (with memory 0, the paper's rule, it is not within these 1500).
TEST_F(HijackTest, TheGuardRefusesAServerThatHijacksLate) {
  auto hijack = FeatureSpaceHijack::Create(spec_, 1, aux_, Options());
  ASSERT_TRUE(hijack.ok()) << hijack.status();
  std::unique_ptr<ModelPart> client;
  Status s = Train(1, hijack->get(), 1500, 2, &client, SplitGuardOptions().threshold, /*honest_steps=*/600);
  EXPECT_TRUE(IsSplitGuardVerdict(s)) << s;
}

TEST(SplitGuardScore, IsThePapersFormula) {
  GradientSet fakes, r1, r2;
  fakes.Add({0, 2});
  r1.Add({1, 0});
  r2.Add({1, 0});
  // θ(F, R) = π/2 with the whole norm gap (|2 - 1| of d = 1), θ(R1, R2) = 0.
  EXPECT_NEAR(SplitGuardScore(fakes, r1, r2), std::pow(1 / (1 + std::exp(-5 * M_PI / 2)), 2), 1e-12);
  // Fakes pointing as the regulars do, with their norm: x = 0 - θ(R1, R2)·1, below sigmoid(0)^2.
  GradientSet same, a, b;
  same.Add({1, 1});
  a.Add({2, 0});
  b.Add({0, 1});
  // ‖R‖ = 1.5, ‖F‖ = √2: d = |√2 - 1.5| + 1; R̄ = (1, 0.5), θ(F̄, R̄) = atan2(1,1) - atan2(0.5,1).
  const double d = std::abs(std::sqrt(2.0) - 1.5) + 1;
  const double x = (M_PI / 4 - std::atan(0.5)) * std::abs(std::sqrt(2.0) - 1.5) / d - (M_PI / 2) * 1 / d;
  EXPECT_NEAR(SplitGuardScore(same, a, b), std::pow(1 / (1 + std::exp(-5 * x)), 2), 1e-12);
  EXPECT_LT(SplitGuardScore(same, a, b), 0.25);
  // No evidence yet: 1.
  EXPECT_EQ(SplitGuardScore(GradientSet{}, a, b), 1);
  EXPECT_EQ(SplitGuardScore(fakes, r1, r1), SplitGuardScore(fakes, r1, r2));
}

TEST(SplitGuard, FakesMoveTheirShareOfLabelsAndKeepPositionsWithoutATarget) {
  SplitGuardOptions o;
  o.seed = 7;
  o.warmup = 2;
  o.fake_rate = 1;
  o.fake_share = 1;
  SplitGuard guard(o);
  EXPECT_FALSE(guard.NextIsFake());
  EXPECT_FALSE(guard.NextIsFake());
  EXPECT_TRUE(guard.NextIsFake());
  const std::vector<int64_t> labels = {0, 3, 9, -100, 5};
  for (int i = 0; i < 20; ++i) {
    std::vector<int64_t> moved = labels;
    guard.Fake(10, &moved);
    const int64_t offset = (moved[0] - labels[0] + 10) % 10;
    EXPECT_GE(offset, 1);
    for (size_t k = 0; k < labels.size(); ++k) {
      if (labels[k] < 0) {
        EXPECT_EQ(moved[k], labels[k]);
      } else {
        EXPECT_EQ(moved[k], (labels[k] + offset) % 10) << "one offset for the whole micro-batch";
      }
    }
  }
  o.fake_share = 0.5;
  SplitGuard half(o);
  std::vector<int64_t> many(2000, 4);
  half.Fake(10, &many);
  const int64_t moved = std::count_if(many.begin(), many.end(), [](int64_t y) { return y != 4; });
  EXPECT_NEAR(moved, 1000, 100);
}

}  // namespace
}  // namespace cleave
