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

}  // namespace
}  // namespace cleave
