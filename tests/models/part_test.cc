#include "models/part.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace cleave {
namespace {

Activations Random(std::vector<int64_t> shape, uint64_t seed) {
  Activations a;
  a.shape = shape;
  a.values.resize(NumElements(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n;
  for (auto& v : a.values) v = n(rng);
  return a;
}

// A micro-batch still pending when another one steps the part back-propagates through
// the weights its forward pass used (weight stashing), and steps the live weights.
TEST(ModelPartTest, PendingMicroBatchesUseTheWeightsTheirForwardUsed) {
  // mlp stage 2 is Linear(200, 10): the input gradient is grad_out x W, the weight
  // gradient grad_out^T x input whatever W is.
  auto part = ModelPart::Create({"mlp", "", 1}, 2, 3);
  ASSERT_TRUE(part.ok()) << part.status();
  const double lr = 0.5;
  (*part)->ResetOptimizer({lr, 0.0, 0.0});
  const ParameterSet w0 = (*part)->Parameters();
  const Activations a = Random({4, 200}, 1), b = Random({4, 200}, 2);
  ASSERT_TRUE((*part)->Forward(1, a).ok());
  ASSERT_TRUE((*part)->Forward(2, b).ok());
  EXPECT_EQ((*part)->pending(), 2u);
  const Activations g = Random({4, 10}, 3);
  ASSERT_TRUE((*part)->Backward(1, g).ok());
  auto gin = (*part)->Backward(2, g);
  ASSERT_TRUE(gin.ok()) << gin.status();
  const auto& w = w0.tensors()[0];  // "2.0.weight", [10, 200]
  ASSERT_EQ(w.shape, (std::vector<int64_t>{10, 200}));
  const ParameterSet after = (*part)->Parameters();
  const auto& w2 = after.tensors()[0];
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 200; ++c) {
      double expect = 0;
      for (int k = 0; k < 10; ++k) expect += g.values[r * 10 + k] * w.values[k * 200 + c];
      ASSERT_NEAR(gin->values[r * 200 + c], expect, 1e-4) << "not the stashed weights";
    }
  }
  // Two plain SGD steps, each with its batch's weight gradient g^T x input.
  for (int k = 0; k < 10; ++k) {
    for (int c = 0; c < 200; ++c) {
      double grad = 0;
      for (int r = 0; r < 4; ++r) {
        grad += g.values[r * 10 + k] * (a.values[r * 200 + c] + b.values[r * 200 + c]);
      }
      ASSERT_NEAR(w2.values[k * 200 + c], w.values[k * 200 + c] - lr * grad, 1e-4);
    }
  }
  EXPECT_EQ((*part)->pending(), 0u);
  EXPECT_EQ((*part)->Backward(2, g).status().code(), absl::StatusCode::kNotFound);
}

TEST(DistanceCorrelationTest, KnownCases) {
  const Activations x = Random({64, 5}, 1);
  EXPECT_NEAR(*DistanceCorrelation(x, x), 1.0, 1e-5);
  Activations affine = x;
  for (auto& v : affine.values) v = 3 * v - 2;
  EXPECT_NEAR(*DistanceCorrelation(x, affine), 1.0, 1e-5) << "invariant to scale and shift";
  const Activations big = Random({256, 5}, 3);
  EXPECT_LT(*DistanceCorrelation(big, Random({256, 5}, 4)), 0.3) << "independent samples";
  EXPECT_FALSE(DistanceCorrelation(x, Random({32, 5}, 2)).ok());
}

// NoPeek: with only the distance-correlation term (zero gradient from the server), the
// head learns to decorrelate its activations from its input; without it nothing moves.
TEST(ModelPartTest, NoPeekLowersTheDistanceCorrelationOfTheActivations) {
  auto dcor_after = [](double alpha) {
    auto part = ModelPart::Create({"mlp", "", 1}, 0, 1);
    EXPECT_TRUE(part.ok());
    (*part)->ResetOptimizer({0.05, 0.9, 0.0});
    (*part)->SetNoPeek(alpha);
    const Activations x = Random({64, 1, 28, 28}, 5);
    const double before = *DistanceCorrelation(x, *(*part)->Forward(0, x));
    for (int step = 1; step <= 60; ++step) {
      auto out = (*part)->Forward(step, x);
      Activations zero = *out;
      std::fill(zero.values.begin(), zero.values.end(), 0.0f);
      EXPECT_TRUE((*part)->Backward(step, zero).ok());
    }
    const double after = *DistanceCorrelation(x, *(*part)->Forward(999, x));
    return std::pair{before, after};
  };
  const auto [b0, a0] = dcor_after(0);
  EXPECT_NEAR(a0, b0, 1e-6) << "no NoPeek, no gradient: unchanged";
  const auto [b1, a1] = dcor_after(1.0);
  EXPECT_LT(a1, b1 - 0.05) << "before " << b1;
}

}  // namespace
}  // namespace cleave
