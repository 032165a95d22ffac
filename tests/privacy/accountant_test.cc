// The RDP accountant against published reference values (TF Privacy's and Opacus's
// tests), and its monotonicity.
#include "privacy/accountant.h"

#include <gtest/gtest.h>

namespace cleave::dp {
namespace {

TEST(AccountantTest, RdpMatchesReferenceValues) {
  auto rdp = ComputeRdp(0.01, 2.5, 50, {5, 50});
  ASSERT_TRUE(rdp.ok()) << rdp.status();
  EXPECT_NEAR((*rdp)[0], 2.18075656e-3, 2.18075656e-3 * 1e-4);
  EXPECT_NEAR((*rdp)[1], 2.38460375e-2, 2.38460375e-2 * 1e-4);
}

TEST(AccountantTest, EpsilonMatchesReferenceValues) {
  std::vector<double> orders;
  for (int x = 11; x < 110; ++x) orders.push_back(x / 10.0);  // 1.1, ..., 10.9
  for (int a = 12; a < 64; ++a) orders.push_back(a);
  auto eps = ComputeEpsilon(0.04, 1.5, 2250, 1e-5, orders);
  ASSERT_TRUE(eps.ok()) << eps.status();
  EXPECT_NEAR(eps->epsilon, 7.32911117143, 1e-6);

  // DP-SGD on MNIST: N = 60000, batch 150, sigma 1.3, 15 epochs.
  std::vector<double> mnist = {1.25, 1.5, 1.75, 2, 2.25, 2.5, 3, 3.5, 4, 4.5};
  for (int a = 5; a < 64; ++a) mnist.push_back(a);
  for (double a : {128, 256, 512}) mnist.push_back(a);
  auto e2 = ComputeEpsilon(150.0 / 60000, 1.3, 15 * 60000 / 150, 1e-5, mnist);
  ASSERT_TRUE(e2.ok()) << e2.status();
  EXPECT_NEAR(e2->epsilon, 0.7242234026109595, 1e-6);
  EXPECT_EQ(e2->order, 19);
}

TEST(AccountantTest, EpsilonGrowsWithStepsAndSamplingRate) {
  double last = 0;
  for (int64_t steps : {1, 10, 100, 1000, 10000}) {
    const double e = ComputeEpsilon(0.01, 1.1, steps, 1e-5)->epsilon;
    EXPECT_GE(e, last) << steps;
    last = e;
  }
  last = 0;
  for (double q : {0.001, 0.01, 0.05, 0.2, 1.0}) {
    const double e = ComputeEpsilon(q, 1.1, 100, 1e-5)->epsilon;
    EXPECT_GT(e, last) << q;
    last = e;
  }
  EXPECT_EQ(ComputeEpsilon(0, 1.1, 100, 1e-5)->epsilon, 0) << "no sampling, no loss";
  // q = 1: the Gaussian mechanism, RDP alpha / (2 sigma^2) per step.
  EXPECT_NEAR((*ComputeRdp(1, 2, 3, {4}))[0], 3 * 4 / 8.0, 1e-12);
}

TEST(AccountantTest, BadArgumentsAreErrors) {
  EXPECT_FALSE(ComputeRdp(1.5, 1, 1, {2}).ok());
  EXPECT_FALSE(ComputeRdp(0.1, 0, 1, {2}).ok());
  EXPECT_FALSE(ComputeRdp(0.1, 1, 1, {1}).ok());
  EXPECT_FALSE(ComputeEpsilon(0.1, 1, 1, 0).ok());
  EXPECT_FALSE(ComputeEpsilon(0.1, 1, 1, 1).ok());
}

}  // namespace
}  // namespace cleave::dp
