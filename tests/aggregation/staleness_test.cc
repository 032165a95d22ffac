#include "aggregation/staleness.h"

#include <gtest/gtest.h>

namespace cleave {
namespace {

SchedulerConfig With(const std::string& rule, double a, int b = 4) {
  SchedulerConfig c;
  c.staleness = rule;
  c.staleness_exponent = a;
  c.staleness_hinge = b;
  return c;
}

TEST(StalenessTest, FreshUpdatesCountFullyUnderEveryRule) {
  for (const char* rule : {"constant", "polynomial", "hinge"}) {
    EXPECT_DOUBLE_EQ(StalenessFactor(With(rule, 2.0), 0), 1.0) << rule;
  }
}

TEST(StalenessTest, ConstantIgnoresStaleness) {
  EXPECT_DOUBLE_EQ(StalenessFactor(With("constant", 3.0), 9), 1.0);
}

TEST(StalenessTest, PolynomialIsOneOverOnePlusSToTheA) {
  EXPECT_DOUBLE_EQ(StalenessFactor(With("polynomial", 0.5), 3), 0.5);   // 4^-0.5
  EXPECT_DOUBLE_EQ(StalenessFactor(With("polynomial", 1.0), 1), 0.5);
  EXPECT_DOUBLE_EQ(StalenessFactor(With("polynomial", 2.0), 9), 0.01);
  EXPECT_DOUBLE_EQ(StalenessFactor(With("polynomial", 0.0), 9), 1.0);
}

TEST(StalenessTest, HingeIsFlatUpToBThenDecays) {
  const SchedulerConfig c = With("hinge", 0.5, 4);
  EXPECT_DOUBLE_EQ(StalenessFactor(c, 4), 1.0);
  EXPECT_DOUBLE_EQ(StalenessFactor(c, 6), 0.5);   // 1 / (1 + 0.5 * 2)
  EXPECT_DOUBLE_EQ(StalenessFactor(c, 10), 0.25); // 1 / (1 + 0.5 * 6)
}

}  // namespace
}  // namespace cleave
