// Randomized response on labels (split.label_epsilon): the keep rate that makes each
// output epsilon-DP in its label, and replacements uniform over the other classes.
#include "privacy/label_dp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "data/dataset.h"

namespace cleave {
namespace {

TEST(LabelDpTest, KeepsEachLabelAtTheRateThatMakesItEpsilonDp) {
  for (double eps : {0.5, 1.0, 4.0}) {
    const int64_t k = 10;
    const double p = KeepProbability(eps, k);
    // P(out = a | y = a) / P(out = a | y = b) = p / ((1 - p) / (K - 1)) = e^eps
    EXPECT_NEAR(p * (k - 1) / (1 - p), std::exp(eps), 1e-9 * std::exp(eps));
    std::mt19937_64 rng(7);
    const int n = 200000;
    std::vector<int64_t> labels(n, 3);
    RandomizeLabels(eps, k, rng, &labels);
    std::map<int64_t, int> counts;
    for (int64_t y : labels) ++counts[y];
    EXPECT_EQ(counts.size(), static_cast<size_t>(k)) << "every class is a possible output";
    const double sd = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(counts[3] / static_cast<double>(n), p, 5 * sd) << eps;
    for (const auto& [y, c] : counts) {
      if (y == 3) continue;
      const double q = (1 - p) / (k - 1);
      EXPECT_NEAR(c / static_cast<double>(n), q, 5 * std::sqrt(q * (1 - q) / n)) << "class " << y;
    }
  }
  EXPECT_NEAR(KeepProbability(50, 10), 1, 1e-12);
  EXPECT_NEAR(KeepProbability(0, 10), 0.1, 1e-12) << "epsilon 0: the label is uniform";
}

TEST(LabelDpTest, LeavesPositionsWithoutATargetAlone) {
  std::mt19937_64 rng(1);
  std::vector<int64_t> labels(1000, kNoTarget);
  labels[0] = 1;
  RandomizeLabels(0.0, 2, rng, &labels);
  for (size_t i = 1; i < labels.size(); ++i) ASSERT_EQ(labels[i], kNoTarget);
  EXPECT_TRUE(labels[0] == 0 || labels[0] == 1);
}

}  // namespace
}  // namespace cleave
