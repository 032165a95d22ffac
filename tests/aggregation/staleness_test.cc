#include "aggregation/staleness.h"

#include <gtest/gtest.h>

#include <cmath>

namespace cleave {
namespace {

// scheduler.staleness, staleness_exponent, staleness_hinge.
struct Rule {
  std::string name;
  double a;
  int b;
};

Rule With(const std::string& rule, double a, int b = 4) { return Rule{rule, a, b}; }

double StalenessFactor(const Rule& r, int64_t s) { return cleave::StalenessFactor(r.name, r.a, r.b, s); }

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
  const Rule c = With("hinge", 0.5, 4);
  EXPECT_DOUBLE_EQ(StalenessFactor(c, 4), 1.0);
  EXPECT_DOUBLE_EQ(StalenessFactor(c, 6), 0.5);   // 1 / (1 + 0.5 * 2)
  EXPECT_DOUBLE_EQ(StalenessFactor(c, 10), 0.25); // 1 / (1 + 0.5 * 6)
}

TEST(StalenessControlTest, SpeedIsAMovingAverageOfStepTimeAndOverhead) {
  ClientSpeed c;
  c.Observe(20, 2.0, 2.5);  // 0.1 s a step, 0.5 s besides
  EXPECT_DOUBLE_EQ(c.step_s, 0.1);
  EXPECT_DOUBLE_EQ(c.overhead_s, 0.5);
  c.Observe(10, 3.0, 3.1);  // 0.3 s a step now: half of each
  EXPECT_DOUBLE_EQ(c.step_s, 0.2);
  EXPECT_DOUBLE_EQ(c.overhead_s, 0.3);
  c.Observe(10, 1.0, 0.5);  // a wall time below the training time counts as no overhead
  EXPECT_DOUBLE_EQ(c.overhead_s, 0.15);
  const ClientSpeed before = c;
  for (double bad : {-1.0, std::nan(""), HUGE_VAL}) c.Observe(10, bad, 1.0);
  c.Observe(0, 1.0, 1.0);
  EXPECT_DOUBLE_EQ(c.step_s, before.step_s) << "reports that cannot be a speed change nothing";
  EXPECT_DOUBLE_EQ(c.overhead_s, before.overhead_s);
}

TEST(StalenessControlTest, StepsFitTheTargetWithinTheirBounds) {
  ClientSpeed slow;
  slow.step_s = 0.5;
  slow.overhead_s = 1.0;
  // Versions every 2 s, target 3: 6 s, less 1 s overhead, is 10 steps of 0.5 s.
  EXPECT_EQ(SizedSteps(100, 1, 3, 2.0, slow), 10);
  EXPECT_EQ(SizedSteps(8, 1, 3, 2.0, slow), 8) << "never more than train's work";
  EXPECT_EQ(SizedSteps(100, 4, 1, 1.0, slow), 4) << "never fewer than min_local_steps";
  EXPECT_EQ(SizedSteps(3, 4, 1, 1.0, slow), 3) << "min_local_steps above train's work";
  // Unknown speed or interval, or control off: train's work.
  EXPECT_EQ(SizedSteps(100, 1, 3, 0.0, slow), 100);
  EXPECT_EQ(SizedSteps(100, 1, 3, 2.0, ClientSpeed{}), 100);
  EXPECT_EQ(SizedSteps(100, 1, 0, 2.0, slow), 100);
}

}  // namespace
}  // namespace cleave
