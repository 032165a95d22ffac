#include "aggregation/gossip_mix.h"

#include <gtest/gtest.h>

#include <cmath>

namespace cleave {
namespace {

ParameterSet Model(std::vector<float> values) {
  ParameterSet p;
  const int64_t n = static_cast<int64_t>(values.size());
  EXPECT_TRUE(p.Add({"w", {n}, std::move(values)}).ok());
  return p;
}

std::vector<float> Values(const ParameterSet& p) { return p.tensors()[0].values; }

GossipRule Rule(const std::string& name, double byzantine) {
  GossipRule r;
  r.name = name;
  r.byzantine = byzantine;
  return r;
}

// mean: w_ii x_i + sum_j w_ij x_j with w_ii = 1 - sum_j w_ij.
TEST(GossipMixTest, MeanIsTheMetropolisAverage) {
  const ParameterSet self = Model({1, 2}), a = Model({3, 4}), b = Model({5, 0});
  GossipMixStats stats;
  const ParameterSet mixed = MixGossip(Rule("mean", 0.5), self, {{0.25, &a}, {0.25, &b}}, &stats);
  EXPECT_EQ(Values(mixed), (std::vector<float>{2.5f, 2.0f}));  // 0.5 (1,2) + 0.25 (3,4) + 0.25 (5,0)
  EXPECT_DOUBLE_EQ(stats.disagreement, 8 + 20);
  EXPECT_EQ(stats.clipped, 0);
  // A neighbour not heard from leaves its weight with self.
  GossipMixStats one;
  EXPECT_EQ(Values(MixGossip(Rule("mean", 0.5), self, {{0.25, &a}}, &one)), (std::vector<float>{1.5f, 2.5f}));
}

// clipped: the radius is the smallest distance beyond which at most `byzantine` of the
// neighbours' weight lies; farther neighbours move self by their weight times the
// radius, however far they are.
TEST(GossipMixTest, ClippingBoundsAFarNeighbour) {
  const ParameterSet self = Model({0, 0}), a = Model({1, 0}), b = Model({0, 1});
  const ParameterSet far = Model({-3000, 4000}), farther = Model({-3e6f, 4e6f});  // both along (-0.6, 0.8)
  GossipMixStats stats;
  const auto rule = Rule("clipped", 0.34);  // weight 0.75 in all: 0.25 may lie beyond the radius
  const ParameterSet mixed = MixGossip(rule, self, {{0.25, &a}, {0.25, &b}, {0.25, &far}}, &stats);
  EXPECT_DOUBLE_EQ(stats.radius, 1);
  EXPECT_EQ(stats.clipped, 1);
  const std::vector<float> v = Values(mixed);
  EXPECT_NEAR(v[0], 0.25 + 0.25 * -0.6, 1e-6);
  EXPECT_NEAR(v[1], 0.25 + 0.25 * 0.8, 1e-6);
  GossipMixStats again;
  EXPECT_EQ(Values(MixGossip(rule, self, {{0.25, &a}, {0.25, &b}, {0.25, &farther}}, &again)), v)
      << "a thousand times farther moves self no more";
  // With no weight assumed hostile nothing is clipped: the mean.
  GossipMixStats none, mean;
  EXPECT_EQ(Values(MixGossip(Rule("clipped", 0), self, {{0.25, &a}, {0.25, &far}}, &none)),
            Values(MixGossip(Rule("mean", 0), self, {{0.25, &a}, {0.25, &far}}, &mean)));
  EXPECT_EQ(none.clipped, 0);
  // Nobody heard: self.
  GossipMixStats alone;
  EXPECT_EQ(Values(MixGossip(rule, self, {}, &alone)), Values(self));
}

// trimmed: per coordinate, floor(byzantine x heard) values dropped at each end of self's
// and the neighbours', the rest averaged with equal weights.
TEST(GossipMixTest, TrimmedMeanDropsTheExtremesOfEachCoordinate) {
  const ParameterSet self = Model({0, 10}), a = Model({1, -50}), b = Model({5, 11}), c = Model({100, 12}),
                     d = Model({-50, 1000});
  const std::vector<HeardModel> heard = {{0.25, &a}, {0.25, &b}, {0.25, &c}, {0.25, &d}};
  GossipMixStats s1, s2, s0;
  EXPECT_EQ(Values(MixGossip(Rule("trimmed", 0.25), self, heard, &s1)), (std::vector<float>{2, 11}));
  EXPECT_EQ(Values(MixGossip(Rule("trimmed", 0.5), self, heard, &s2)), (std::vector<float>{1, 11}));
  EXPECT_EQ(Values(MixGossip(Rule("trimmed", 0), self, heard, &s0)), (std::vector<float>{11.2f, 196.6f}));
  GossipMixStats s9;  // 0.9 x 4 = 3 from each end of 5 values: no more than down to the median
  EXPECT_EQ(Values(MixGossip(Rule("trimmed", 0.9), self, heard, &s9)), (std::vector<float>{1, 11}));
  EXPECT_GT(s1.disagreement, 0);
}

TEST(GossipMixTest, RuleNamesAreChecked) {
  EXPECT_TRUE(GossipRuleNames().Check("clipped").ok());
  EXPECT_FALSE(GossipRuleNames().Check("median").ok());
}

}  // namespace
}  // namespace cleave
