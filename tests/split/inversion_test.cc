// Input reconstruction from a LeNet-5's activations at its first cut (models/inversion.h),
// on Fashion-MNIST: the learned inverter and white-box optimisation recover images
// (scored with SSIM, split/attacks.h) unless activation noise drowns them.
#include "models/inversion.h"

#include <gtest/gtest.h>

#include <numeric>

#include "data/dataset.h"
#include "split/attacks.h"
#include "split/leakage.h"

namespace cleave {
namespace {

class InversionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetTorchThreads(1);
    auto test = LoadFashionMnist("/usr/share/datasets/fashion-mnist", /*train=*/false, 1000);
    auto train = LoadFashionMnist("/usr/share/datasets/fashion-mnist", /*train=*/true, 32);
    ASSERT_TRUE(test.ok() && train.ok());
    space_ = *train;
    std::vector<int64_t> aux(test->size), device(train->size);
    std::iota(aux.begin(), aux.end(), 0);
    std::iota(device.begin(), device.end(), 0);
    aux_ = InputBatch(*test, aux);
    device_ = InputBatch(*train, device);
    view_.spec.name = "lenet5";
    view_.spec.seed = 1;
    view_.cut = 1;
    auto part = ModelPart::Create(view_.spec, 0, 1);
    ASSERT_TRUE(part.ok()) << part.status();
    view_.part = (*part)->Parameters();
    options_.hidden = 256;  // smaller and quicker than the attack's own
    options_.lo = -space_.mean[0] / space_.stddev[0];
    options_.hi = (1 - space_.mean[0]) / space_.stddev[0];
  }

  double MeanSsim(const Activations& images) const {
    return cleave::MeanSsim(device_.values, images.values, device_.batch(), {1, 28, 28}, space_);
  }

  Dataset space_;
  Activations aux_, device_;
  ClientPartView view_;
  InversionOptions options_;
};

TEST_F(InversionTest, RecoversImagesAtTheFirstCutUnlessNoiseDrownsThem) {
  auto sent = ClientActivations(view_, device_, 1);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(sent->shape, (std::vector<int64_t>{32, 6, 12, 12}));

  options_.steps = 300;
  auto inverter = LearnedInverter::Train(view_, aux_, options_);
  ASSERT_TRUE(inverter.ok()) << inverter.status();
  auto learned = (*inverter)->Invert(*sent);
  ASSERT_TRUE(learned.ok()) << learned.status();
  EXPECT_EQ(learned->shape, device_.shape);
  const double learned_ssim = MeanSsim(*learned);
  EXPECT_GT(learned_ssim, 0.45);

  options_.steps = 100;
  options_.lr = 0.05;
  options_.tv = 0.05;
  auto optimised = InvertByOptimisation(view_, *sent, options_);
  ASSERT_TRUE(optimised.ok()) << optimised.status();
  const double optimised_ssim = MeanSsim(*optimised);
  EXPECT_GT(optimised_ssim, 0.45);
  for (float v : optimised->values) ASSERT_TRUE(v >= options_.lo && v <= options_.hi);

  // Noise far above the activations' scale: the adaptive inverter (trained under the
  // same noise) and the optimisation both lose the images.
  view_.noise = 5;
  auto noisy = ClientActivations(view_, device_, 2);
  ASSERT_TRUE(noisy.ok());
  options_.steps = 300;
  options_.lr = 1e-3;
  auto noisy_inverter = LearnedInverter::Train(view_, aux_, options_);
  ASSERT_TRUE(noisy_inverter.ok());
  const double noisy_ssim = MeanSsim((*noisy_inverter)->Invert(*noisy).value());
  EXPECT_LT(noisy_ssim, learned_ssim - 0.15) << learned_ssim;
  std::cout << "SSIM learned " << learned_ssim << ", optimised " << optimised_ssim << ", learned under noise 5 "
            << noisy_ssim << "\n";
}

TEST_F(InversionTest, RefusesWhatItCannotAttack) {
  options_.steps = 1;
  ClientPartView v = view_;
  v.cut = 0;
  EXPECT_EQ(LearnedInverter::Train(v, aux_, options_).status().code(), absl::StatusCode::kInvalidArgument);
  v = view_;
  v.part = ParameterSet();
  EXPECT_EQ(InvertByOptimisation(v, device_, options_).status().code(), absl::StatusCode::kInvalidArgument);
  v = view_;
  v.spec.name = "gpt";
  EXPECT_EQ(ClientActivations(v, device_, 1).status().code(), absl::StatusCode::kInvalidArgument);
  v = view_;
  v.codec = "nonsense";
  EXPECT_FALSE(ClientActivations(v, device_, 1).ok());
  auto inverter = LearnedInverter::Train(view_, aux_, options_);
  ASSERT_TRUE(inverter.ok());
  Activations wrong{{2, 5}, std::vector<float>(10)};
  EXPECT_EQ((*inverter)->Invert(wrong).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InvertByOptimisation(view_, wrong, options_).status().code(), absl::StatusCode::kInvalidArgument);
}

// The server's own measure for the privacy floor: the first cut leaks more than the
// last; too few auxiliary images or images of another shape are refused.
TEST_F(InversionTest, TheServersMeasureFindsTheFirstCutLeakiest) {
  LeakageOptions o;
  o.train_images = 500;
  o.probe_images = 16;
  o.steps = 150;
  o.hidden = 256;
  o.optimise_steps = 50;
  auto test = LoadFashionMnist("/usr/share/datasets/fashion-mnist", /*train=*/false, 600);
  ASSERT_TRUE(test.ok());
  auto whole = ModelPart::Create(view_.spec, 0, 5);
  ASSERT_TRUE(whole.ok());
  view_.part = (*whole)->Parameters();
  auto first = MeasureReconstructionSsim(view_, *test, o);
  view_.cut = 4;
  auto last = MeasureReconstructionSsim(view_, *test, o);
  ASSERT_TRUE(first.ok() && last.ok()) << first.status() << last.status();
  EXPECT_GT(*first, *last + 0.1);
  EXPECT_EQ(MeasureReconstructionSsim(view_, test->Subset({0, 1, 2}), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  view_.spec.input_shape = {3, 32, 32};
  EXPECT_EQ(MeasureReconstructionSsim(view_, *test, o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave
