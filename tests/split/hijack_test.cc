// A malicious server's feature-space hijacking (FeatureSpaceHijack, models/inversion.h)
// against a LeNet-5 client part at its first cut, on Fashion-MNIST, and the device's
// SplitGuard (privacy/split_guard.h): the hijack makes the device's own activations
// invertible, and the guard tells the hijack's gradients from an honest server's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
  // The guard's defaults, with `seed` and `threshold`.
  static SplitGuardOptions Guard(uint64_t seed, double threshold = SplitGuardOptions().threshold) {
    SplitGuardOptions o;
    o.enabled = true;
    o.seed = seed;
    o.threshold = threshold;
    return o;
  }
  // Trains the client part [0, cut) for `steps` micro-batches of 32 against an honest
  // server part (the labels) or the hijack, the guard watching; returns the guard's
  // refusal (OK: none) and leaves the client part in `client`. With `honest_steps`, the
  // server trains honestly that long before it hijacks; `watch` (when given) follows the
  // guard.
  struct Watch {
    int steps = 0;             // micro-batches trained, the refused one included
    double last_mean = 1;      // the guard's mean score at the end
    double lowest_mean = 1;    // once it averages min_fakes scores (as a verdict does)
  };
  Status Train(int cut, FeatureSpaceHijack* hijack, int steps, const SplitGuardOptions& guard_options,
               std::unique_ptr<ModelPart>* client, int honest_steps = 0, Watch* watch = nullptr) {
    *client = Part(0, cut);
    std::unique_ptr<ModelPart> server = Part(cut, 5);
    SplitGuard guard(guard_options);
    Watch local;
    if (watch == nullptr) watch = &local;
    for (int step = 0; step < steps; ++step) {
      watch->steps = step + 1;
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
      const Status verdict = guard.Add(fake, p.first_gradient);
      watch->last_mean = guard.mean_score();
      if (guard.scores() >= guard_options.min_fakes) watch->lowest_mean = std::min(watch->lowest_mean, watch->last_mean);
      RETURN_IF_ERROR(verdict);
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
  ASSERT_TRUE(Train(1, hijack->get(), 900, Guard(1, /*threshold=*/0), &client).ok());  // a guard that never refuses
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
    EXPECT_TRUE(Train(cut, nullptr, 500, Guard(1), &client).ok()) << "honest server, cut " << cut;
    auto hijack = FeatureSpaceHijack::Create(spec_, cut, aux_, Options());
    ASSERT_TRUE(hijack.ok()) << hijack.status();
    Status s = Train(cut, hijack->get(), 500, Guard(1), &client);
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
  Status s = Train(1, hijack->get(), 1500, Guard(2), &client, /*honest_steps=*/600);
  EXPECT_TRUE(IsSplitGuardVerdict(s)) << s;
}

// Not a test: the measurements in docs/benchmarks.md ("A malicious server and the
// device's guard"), for 20 guard seeds with the guard's defaults:
//   1. a hijack from the start, at cuts 1 and 3: the mean score at the verdict, and the
//      micro-batch of the verdict; an honest server: its lowest mean score (600
//      micro-batches each);
//   2. a late hijack (after 600 honest micro-batches): how many micro-batches later the
//      guard refuses the server, with its fading evidence and with the paper's (memory 0).
//   build/bin/split_test --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_GuardMeasurements*'
TEST_F(HijackTest, DISABLED_GuardMeasurements) {
  const auto cell = [](const Status& s, const Watch& w, int from = 0) {
    return IsSplitGuardVerdict(s) ? absl::StrFormat("%.3f at %d", w.last_mean, w.steps - from) : std::string("none");
  };
  printf("| seed | hijack at cut 1: mean score at the verdict, at micro-batch | cut 3 | honest server, cut 1: lowest mean score | cut 3 |\n"
         "| --- | --- | --- | --- | --- |\n");
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::string row = absl::StrCat("| ", seed);
    std::string honest;
    for (int cut : {1, 3}) {
      auto hijack = FeatureSpaceHijack::Create(spec_, cut, aux_, Options());
      ASSERT_TRUE(hijack.ok()) << hijack.status();
      std::unique_ptr<ModelPart> client;
      Watch w;
      Status s = Train(cut, hijack->get(), 600, Guard(seed * 7919), &client, 0, &w);
      absl::StrAppend(&row, " | ", cell(s, w));
      Watch h;
      s = Train(cut, nullptr, 600, Guard(seed * 7919), &client, 0, &h);
      absl::StrAppend(&honest, " | ", IsSplitGuardVerdict(s) ? "refused: " + cell(s, h) : absl::StrFormat("%.3f", h.lowest_mean));
    }
    printf("%s%s |\n", row.c_str(), honest.c_str());
    fflush(stdout);
  }
  constexpr int kHonest = 600, kSteps = 2400;
  printf("\n| seed | late hijack: micro-batches to the verdict, memory 100 | memory 0 (the paper's) |\n| --- | --- | --- |\n");
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::string row = absl::StrCat("| ", seed);
    for (int memory : {100, 0}) {
      auto hijack = FeatureSpaceHijack::Create(spec_, 1, aux_, Options());
      ASSERT_TRUE(hijack.ok()) << hijack.status();
      SplitGuardOptions o = Guard(seed * 7919);
      o.memory = memory;
      std::unique_ptr<ModelPart> client;
      Watch w;
      const Status s = Train(1, hijack->get(), kSteps, o, &client, kHonest, &w);
      absl::StrAppend(&row, " | ", IsSplitGuardVerdict(s) ? cell(s, w, kHonest) : absl::StrCat("none in ", kSteps - kHonest));
    }
    printf("%s |\n", row.c_str());
    fflush(stdout);
  }
}

// The paper's formula, with the regulars' half R2 replaced by the controls C.
TEST(SplitGuardScore, IsThePapersFormulaAgainstControls) {
  GradientSet fakes, controls, regulars;
  fakes.Add({0, 2});
  controls.Add({1, 0});
  regulars.Add({1, 0});
  // θ(F, R) = π/2 with the whole norm gap (|2 - 1| of d = 1), θ(C, R) = 0.
  EXPECT_NEAR(SplitGuardScore(fakes, controls, regulars), std::pow(1 / (1 + std::exp(-5 * M_PI / 2)), 2), 1e-12);
  // Fakes nearer the regulars than the controls: ‖F‖ = √2, ‖C‖ = 2, ‖R‖ = 1, so
  // d = (√2 - 1) + 1; θ(F, R) = π/4, θ(C, R) = π/2; x < 0, below sigmoid(0)^2.
  GradientSet same, off;
  same.Add({1, 1});
  off.Add({0, 2});
  const double d = std::sqrt(2.0);
  const double x = (M_PI / 4) * (std::sqrt(2.0) - 1) / d - (M_PI / 2) * 1 / d;
  EXPECT_NEAR(SplitGuardScore(same, off, regulars), std::pow(1 / (1 + std::exp(-5 * x)), 2), 1e-12);
  EXPECT_LT(SplitGuardScore(same, off, regulars), 0.25);
  // Fakes that look like the controls: x = 0, sigmoid(0)^2.
  EXPECT_NEAR(SplitGuardScore(same, same, regulars), 0.25, 1e-12);
  // No evidence yet: 1.
  EXPECT_EQ(SplitGuardScore(GradientSet{}, controls, regulars), 1);
  EXPECT_EQ(SplitGuardScore(fakes, GradientSet{}, regulars), 1);
}

// Gradients that do not depend on the labels, with so much noise around their mean that a
// handful of fakes points well off it while many regulars do not. The guard's controls
// are as few and as noisy as its fakes, so such a server scores near sigmoid(0)^2 = 0.25
// and is refused. (The paper's two halves of the regulars are not: it scores these 0.6
// to 0.75 on average, around its threshold of 0.7, and so missed a hijack once in CI.)
// Fakes pulled elsewhere, as an honest server's are, score near 1 and are never refused.
TEST(SplitGuard, RefusesNoisyGradientsThatIgnoreTheLabelsAndNotAnHonestServer) {
  constexpr int kDim = 64;
  for (uint64_t seed : {1, 2, 3, 4, 5}) {
    std::mt19937_64 noise(seed);
    std::normal_distribution<float> gauss(0, 1);
    const auto gradient = [&](bool pulled) {
      std::vector<float> g(kDim);
      const float scale = std::exp(0.5f * gauss(noise));  // norms that vary from one micro-batch to the next
      for (float& v : g) v = scale * gauss(noise);
      g[0] += 3;                // the mean: off a few fakes' mean by the noise, not off many regulars'
      if (pulled) g[1] += 16;   // where an honest server's fakes go
      return g;
    };
    // Without a verdict: the mean score after each fake, averaged over 2000 micro-batches.
    for (bool honest : {false, true}) {
      SplitGuardOptions o;
      o.seed = seed;
      o.threshold = 0;
      SplitGuard guard(o);
      double sum = 0;
      int n = 0;
      for (int step = 0; step < 2000; ++step) {
        const bool fake = guard.NextIsFake();
        ASSERT_TRUE(guard.Add(fake, gradient(honest && fake)).ok());
        if (fake && guard.fakes() > o.min_fakes) sum += guard.mean_score(), ++n;
      }
      ASSERT_GT(n, 40);
      if (honest) {
        EXPECT_GT(sum / n, 0.9) << "seed " << seed;
      } else {
        EXPECT_LT(sum / n, 0.5) << "seed " << seed;
      }
    }
    // With the defaults.
    for (bool honest : {false, true}) {
      SplitGuardOptions o;
      o.seed = seed;
      SplitGuard guard(o);
      Status s;
      for (int step = 0; step < 2000 && s.ok(); ++step) {
        const bool fake = guard.NextIsFake();
        s = guard.Add(fake, gradient(honest && fake));
      }
      if (honest) {
        EXPECT_TRUE(s.ok()) << "seed " << seed << ": " << s;
      } else {
        EXPECT_TRUE(IsSplitGuardVerdict(s)) << "seed " << seed << ": " << s;
      }
    }
  }
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
