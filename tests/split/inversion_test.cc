// Input reconstruction from a LeNet-5's activations at its first cut (models/inversion.h),
// on Fashion-MNIST: the learned inverter and white-box optimisation recover images
// (scored with SSIM, split/attacks.h) unless activation noise drowns them.
#include "models/inversion.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <numeric>
#include <random>

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
    SetInputRange(space_, &options_);
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
  v.spec.name = "gpt";  // a decoder's tokens are LearnedTokenInverter's
  auto text = LearnedInverter::Train(v, aux_, options_);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("cleave attack tokens"), std::string::npos) << text.status();
  EXPECT_EQ(LearnedTokenInverter::Train(view_, aux_, options_).status().code(), absl::StatusCode::kInvalidArgument)
      << "an image model's part is not a decoder's";
  v = view_;
  v.codec = "nonsense";
  EXPECT_FALSE(ClientActivations(v, device_, 1).ok());
  auto inverter = LearnedInverter::Train(view_, aux_, options_);
  ASSERT_TRUE(inverter.ok());
  Activations wrong{{2, 5}, std::vector<float>(10)};
  EXPECT_EQ((*inverter)->Invert(wrong).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InvertByOptimisation(view_, wrong, options_).status().code(), absl::StatusCode::kInvalidArgument);
}

// DLG / iDLG on one client's update after one SGD step on a small batch: the labels come
// off the output bias, the images back from noise; and Model::Train's first batch is
// the one FirstBatchIndices names (what a device keeps as the truth).
TEST_F(InversionTest, InvertsAFederatedUpdateOfOneStep) {
  auto model = Model::Create(view_.spec);
  ASSERT_TRUE(model.ok());
  const ParameterSet global = (*model)->Parameters();
  LocalTrainOptions o;
  o.local_steps = 1;
  o.batch_size = 2;
  o.lr = 0.1;
  o.seed = 9;
  ASSERT_TRUE((*model)->Train(space_, o).ok());
  ParameterSet update = (*model)->Parameters();
  for (size_t t = 0; t < update.tensors().size(); ++t) {
    for (size_t i = 0; i < update.tensors()[t].values.size(); ++i) {
      update.mutable_tensors()[t].values[i] -= global.tensors()[t].values[i];
    }
  }
  const std::vector<int64_t> first = FirstBatchIndices(space_.size, o.seed, o.batch_size);
  ASSERT_EQ(first.size(), 2u);
  {  // the same step on exactly that batch gives the same update
    auto again = Model::Create(view_.spec);
    ASSERT_TRUE(again.ok());
    ASSERT_TRUE((*again)->Train(space_.Subset(first), o).ok());
    const ParameterSet stepped = (*again)->Parameters();
    for (size_t t = 0; t < stepped.tensors().size(); ++t) {
      for (size_t i = 0; i < stepped.tensors()[t].values.size(); ++i) {
        ASSERT_NEAR(stepped.tensors()[t].values[i] - global.tensors()[t].values[i], update.tensors()[t].values[i], 1e-6)
            << stepped.tensors()[t].name;
      }
    }
  }
  options_.steps = 1000;
  options_.lr = 0.1;
  options_.tv = 0.02;
  auto inverted = InvertUpdate(view_.spec, global, update, o.lr, 2, options_);
  ASSERT_TRUE(inverted.ok()) << inverted.status();
  std::vector<int64_t> truth_labels = BatchLabels(space_, first), guessed = inverted->labels;
  std::sort(truth_labels.begin(), truth_labels.end());
  std::sort(guessed.begin(), guessed.end());
  EXPECT_EQ(guessed, truth_labels);
  const Activations truth = InputBatch(space_, first);
  // The batch's order is not in the gradient: each image against its best match.
  double best = 0;
  for (int64_t i = 0; i < 2; ++i) {
    double b = 0;
    for (int64_t j = 0; j < 2; ++j) {
      const std::vector<float> a = ImagePixels(truth.values, i, {1, 28, 28}, space_);
      const std::vector<float> r = ImagePixels(inverted->inputs.values, j, {1, 28, 28}, space_);
      b = std::max(b, Ssim(a.data(), r.data(), 1, 28, 28, 1));
    }
    best += b / 2;
  }
  std::cout << "DLG SSIM " << best << "\n";
  EXPECT_GT(best, 0.25);
}

// The learned token inverter on a small decoder: from the embedding cut and after a
// block it tells most positions' tokens (random sequences: chance is 1 in 32).
TEST(TokenInversionTest, RecoversTokensAtAndPastTheEmbeddingCut) {
  SetTorchThreads(1);
  ClientPartView view;
  view.spec.name = "gpt";
  view.spec.gpt = {/*vocab=*/32, /*context=*/8, /*layers=*/2, /*heads=*/2, /*dim=*/16, /*tie=*/false};
  auto whole = ModelPart::Create(view.spec, 0, 4);
  ASSERT_TRUE(whole.ok()) << whole.status();
  view.part = (*whole)->Parameters();
  std::mt19937_64 rng(4);
  std::uniform_int_distribution<int> token(0, 31);
  auto sequences = [&](int64_t n) {
    Activations a{{n, 8}, std::vector<float>(n * 8)};
    for (float& v : a.values) v = static_cast<float>(token(rng));
    return a;
  };
  const Activations aux = sequences(400), device = sequences(16);
  InversionOptions o;
  o.steps = 300;
  o.batch = 16;
  o.hidden = 128;
  o.lr = 3e-3;
  for (int cut : {1, 2}) {
    view.cut = cut;
    auto inverter = LearnedTokenInverter::Train(view, aux, o);
    ASSERT_TRUE(inverter.ok()) << inverter.status();
    auto sent = ClientActivations(view, device, 1);
    ASSERT_TRUE(sent.ok()) << sent.status();
    auto guessed = (*inverter)->Invert(*sent);
    ASSERT_TRUE(guessed.ok()) << guessed.status();
    int right = 0;
    for (size_t i = 0; i < guessed->size(); ++i) right += (*guessed)[i] == static_cast<int64_t>(device.values[i]);
    EXPECT_GT(right, static_cast<int>(guessed->size()) / 2) << "cut " << cut;
  }
}

// The text floor's measure: on a small decoder, most of the probe sequences' tokens at the
// embedding cut; an image data set is refused.
TEST(TokenInversionTest, TheServersMeasureRecoversTokens) {
  SetTorchThreads(1);
  auto text = LoadDataSpec("text:/usr/share/games/fortunes,context=16", /*train=*/false);
  ASSERT_TRUE(text.ok()) << text.status();
  ClientPartView view;
  view.spec.name = "gpt";
  view.spec.gpt = {/*vocab=*/256, /*context=*/16, /*layers=*/1, /*heads=*/2, /*dim=*/16, /*tie=*/false};
  view.cut = 1;
  auto part = ModelPart::Create(view.spec, 0, 1);
  ASSERT_TRUE(part.ok());
  view.part = (*part)->Parameters();
  LeakageOptions o;
  o.train_images = 300;
  o.probe_images = 16;
  o.steps = 100;
  auto rate = MeasureTokenRecovery(view, *text, o);
  ASSERT_TRUE(rate.ok()) << rate.status();
  EXPECT_GT(*rate, 0.9) << "the nearest embedding, undefended";
  auto images = LoadFashionMnist("/usr/share/datasets/fashion-mnist", /*train=*/false, 100);
  ASSERT_TRUE(images.ok());
  EXPECT_EQ(MeasureTokenRecovery(view, *images, o).status().code(), absl::StatusCode::kInvalidArgument);
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
