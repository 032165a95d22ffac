// Robust rules on known answers, and DP-FedAvg's clipping, noise and accounting.
#include <gtest/gtest.h>

#include <cmath>

#include "aggregation/dp.h"
#include "aggregation/registry.h"
#include "aggregation/robust.h"
#include "aggregation/strategy.h"
#include "privacy/accountant.h"
#include "job/job.h"

namespace cleave {
namespace {

using robust::Updates;

const Updates kThree = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}};

TEST(RobustTest, KnownAnswers) {
  using V = std::vector<float>;
  EXPECT_EQ(robust::Mean(kThree), (V{4, 5, 6}));
  EXPECT_EQ(robust::Median(kThree), (V{4, 5, 6}));
  EXPECT_EQ(robust::TrimmedMean(kThree, 1), (V{4, 5, 6}));
  EXPECT_EQ(robust::Krum(kThree, 1), (V{1, 2, 3}));
  EXPECT_EQ(robust::MultiKrum(kThree, 1, 2), (V{2.5, 3.5, 4.5}));
}

// The name tables (aggregation/registry.h) and the factories agree: every name builds,
// a name outside the table is refused with the table's error.
TEST(AggregationNamesTest, EveryStrategyAndRuleInTheTableIsBuilt) {
  for (const std::string& n : StrategyNames().names) {
    StrategyJob c;
    c.strategy.name = n;
    EXPECT_TRUE(CreateStrategy(c).ok()) << n;
  }
  StrategyJob bogus;
  bogus.strategy.name = "fedfoo";
  EXPECT_NE(CreateStrategy(bogus).status().message().find("strategy.name: unknown 'fedfoo'"),
            std::string::npos);
  const Updates u = {{1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}, {7, 8}};
  const std::vector<double> w(u.size(), 1.0);
  for (const std::string& rule : RuleNames().names) {
    auto a = robust::Aggregate(rule, u, w, 1, 0, 10.0, {1, 1});
    EXPECT_TRUE(a.ok()) << rule << ": " << a.status();
  }
  EXPECT_NE(robust::Aggregate("average", u, w, 1, 0, 10.0, {1, 1}).status().message().find(
                "aggregation.rule: unknown 'average'"),
            std::string::npos);
}

TEST(RobustTest, RulesResistOutliersAndTheMeanDoesNot) {
  // Nine honest updates near (1, 1), two attackers far away (Bulyan needs n >= 4f + 3).
  Updates u = {{1.0f, 1.1f}, {0.9f, 1.0f}, {1.1f, 0.9f}, {1.0f, 1.0f}, {0.95f, 1.05f},
               {1.05f, 0.95f}, {1.0f, 0.98f}, {0.98f, 1.02f}, {1.02f, 1.0f}, {-50, 60},
               {-50, 60}};
  const std::vector<double> w(u.size(), 1);
  for (const std::string rule : {"median", "trimmed_mean", "krum", "multi_krum", "bulyan"}) {
    auto a = robust::Aggregate(rule, u, w, 2, 0, 0);
    ASSERT_TRUE(a.ok()) << rule << ": " << a.status();
    EXPECT_NEAR((*a)[0], 1.0, 0.1) << rule;
    EXPECT_NEAR((*a)[1], 1.0, 0.1) << rule;
  }
  EXPECT_LT((*robust::Aggregate("mean", u, w, 2, 0, 0))[0], -5) << "the mean is dragged away";
  // norm_bound caps each update's influence at max_norm.
  auto nb = robust::Aggregate("norm_bound", u, w, 0, 0, 2.0);
  ASSERT_TRUE(nb.ok());
  EXPECT_GT((*nb)[0], 0.3);
}

// FLTrust: updates pointing away from the server's own update get no trust; the rest
// are scaled to its norm and weighted by their cosine.
TEST(RobustTest, FlTrustKnownAnswers) {
  auto a = robust::FlTrust({{1, 0}, {0, 1}, {-1, 0}}, {2, 0});
  EXPECT_NEAR(a[0], 2.0, 1e-6);
  EXPECT_NEAR(a[1], 0.0, 1e-6);
  auto b = robust::FlTrust({{1, 1}, {2, 0}}, {1, 0});
  const double c = 1 / std::sqrt(2.0);
  EXPECT_NEAR(b[0], (c * c + 1) / (c + 1), 1e-6);
  EXPECT_NEAR(b[1], (c * c) / (c + 1), 1e-6);
  auto none = robust::FlTrust({{-1, 0}}, {1, 0});
  EXPECT_EQ(none, (std::vector<float>{0, 0})) << "no trusted update: no step";
  EXPECT_EQ(robust::Aggregate("fltrust", {{1, 0}}, {1}, 0, 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "no server update given";
}

TEST(RobustTest, BulyanAveragesTheValuesClosestToTheMedian) {
  // n = 7, f = 1: Krum picks theta = 5, then beta = 3 values per coordinate around the median.
  Updates u = {{0}, {1}, {2}, {3}, {4}, {100}, {-100}};
  auto b = robust::Bulyan(u, 1);
  EXPECT_NEAR(b[0], 2.0, 1e-6);
}

TEST(RobustTest, TooFewUpdatesForTheRuleAreAnError) {
  const std::vector<double> w(3, 1);
  EXPECT_EQ(robust::Aggregate("bulyan", kThree, w, 1, 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(robust::Aggregate("trimmed_mean", kThree, w, 2, 0, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(robust::Aggregate("multi_krum", kThree, w, 1, 5, 0).ok());
}

TEST(DpTest, ClippingNeverIncreasesANorm) {
  for (double norm : {0.0, 1e-9, 0.5, 1.0, 1.5, 1e6}) {
    const double f = ClipFactor(norm, 1.0);
    EXPECT_LE(f, 1.0);
    EXPECT_LE(norm * f, std::max(norm, 0.0) + 1e-12);
    EXPECT_LE(norm * f, 1.0 + 1e-12);
    if (norm <= 1.0) {
      EXPECT_EQ(f, 1.0) << "within the bound: untouched";
    }
  }
  EXPECT_TRUE(UpdateNoiseMultiplier(1.0, 0.4).status().code() == absl::StatusCode::kInvalidArgument);
  EXPECT_NEAR(*UpdateNoiseMultiplier(1.0, 1.0), 1 / std::sqrt(0.75), 1e-12);
}

std::unique_ptr<Strategy> DpFedAvg(const std::string& dp_yaml, uint64_t seed) {
  auto c = ParseJob("dp: " + dp_yaml + "\n", "");
  EXPECT_TRUE(c.ok()) << c.status();
  auto inner = CreateStrategy(StrategyJob());  // plain fedavg
  return MakeDpStrategy(*std::move(inner), c->dp, seed);
}

ParameterSet Filled(int64_t n, float v) {
  ParameterSet ps;
  ps.Add({"w", {n}, std::vector<float>(n, v)}).IgnoreError();
  return ps;
}

// Central noise has std z·C/n: four zero updates (norm 0, handled) leave pure noise.
TEST(DpTest, CentralNoiseHasStdZCOverN) {
  auto s = DpFedAvg("{noise_multiplier: 1.0, clip: 2.0}", 7);
  ParameterSet global = Filled(200000, 0);
  std::mt19937_64 rng(1);
  const std::vector<std::string> all = {"a", "b", "c", "d", "e", "f", "g", "h"};
  auto plan = s->ConfigureRound(1, all, rng);
  ASSERT_EQ(plan.clients.size(), all.size());
  s->BeginRound(global, 1);
  const ParameterSet zero = Filled(200000, 0);
  for (int i = 0; i < 4; ++i) s->Accumulate(ClientUpdate::Unnamed(ViewsOf(zero), 100), 0);
  ASSERT_TRUE(s->FinishRound(0, &global).ok());
  double sum = 0, sq = 0;
  for (float v : global.tensors()[0].values) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double n = 200000, mean = sum / n, stddev = std::sqrt(sq / n - mean * mean);
  EXPECT_NEAR(mean, 0, 0.005);
  EXPECT_NEAR(stddev, 1.0 * 2.0 / 4, 0.005) << "z C / n";
  EXPECT_NEAR(s->RoundStats().at("dp_noise_std"), 0.5, 1e-12);
}

// Clipped updates count equally: one huge update cannot move the model more than C/n.
TEST(DpTest, UpdatesAreClippedAndAveragedWithEqualWeights) {
  auto s = DpFedAvg("{noise_multiplier: 1e-6, clip: 1.0}", 7);
  ParameterSet global = Filled(4, 0);
  std::mt19937_64 rng(1);
  s->ConfigureRound(1, {"a", "b"}, rng);
  s->BeginRound(global, 1);
  const ParameterSet huge = Filled(4, 1000), small = Filled(4, 0.1f);  // norms 2000, 0.2
  s->Accumulate(ClientUpdate::Unnamed(ViewsOf(huge), 1), 0);
  s->Accumulate(ClientUpdate::Unnamed(ViewsOf(small), 1000), 0);
  ASSERT_TRUE(s->FinishRound(0, &global).ok());
  // (0.5 per coordinate from the clipped huge one + 0.1) / 2.
  for (float v : global.tensors()[0].values) EXPECT_NEAR(v, 0.3, 1e-4);
}

// Zero-padded submodel updates: each element's clipped sum is divided by the results
// that hold it, with noise z·C on the sum; an element nobody holds stays.
TEST(DpTest, HoldersDivideEachElementsNoisedSum) {
  auto s = DpFedAvg("{noise_multiplier: 1e-6, clip: 1.0}", 7);
  ParameterSet global = Filled(4, 0);
  std::mt19937_64 rng(1);
  s->ConfigureRound(1, {"a", "b"}, rng);
  s->BeginRound(global, 1);
  ParameterSet whole = Filled(4, 0), small = Filled(4, 0);
  whole.mutable_tensors()[0].values = {0.2f, 0.2f, 0.2f, 0.2f};  // norm 0.4: kept
  small.mutable_tensors()[0].values = {3.0f, 4.0f, 0.0f, 0.0f};  // norm 5: clipped to 1
  s->Accumulate(ClientUpdate::Unnamed(ViewsOf(whole), 1), 0);
  s->Accumulate(ClientUpdate::Unnamed(ViewsOf(small), 1), 0);
  ParameterSet holders = Filled(4, 0);
  holders.mutable_tensors()[0].values = {2, 2, 1, 1};
  s->SetHolders(holders);
  ASSERT_TRUE(s->FinishRound(0, &global).ok());
  const auto& v = global.tensors()[0].values;
  EXPECT_NEAR(v[0], (0.2 + 0.6) / 2, 1e-4);
  EXPECT_NEAR(v[1], (0.2 + 0.8) / 2, 1e-4);
  EXPECT_NEAR(v[2], 0.2, 1e-4) << "one holder: not halved";
  EXPECT_NEAR(v[3], 0.2, 1e-4);
  // The next round forgets them: the plain mean over both results.
  s->ConfigureRound(2, {"a", "b"}, rng);
  global = Filled(4, 0);
  s->BeginRound(global, 1);
  s->Accumulate(ClientUpdate::Unnamed(ViewsOf(whole), 1), 0);
  s->Accumulate(ClientUpdate::Unnamed(ViewsOf(small), 1), 0);
  ASSERT_TRUE(s->FinishRound(0, &global).ok());
  EXPECT_NEAR(global.tensors()[0].values[2], 0.1, 1e-4);
}

// The reported epsilon is the accountant's for the job's settings, round after round;
// adaptive clipping lowers C when most updates are within it.
TEST(DpTest, ReportedEpsilonMatchesTheAccountantAndAdaptiveClipMoves) {
  auto s = DpFedAvg("{noise_multiplier: 1.1, clip: 5.0, adaptive: true, clip_count_stddev: 1.0, "
                    "target_quantile: 0.5, clip_lr: 0.2, delta: 1e-5}",
                    3);
  const std::vector<std::string> all = {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"};
  std::mt19937_64 rng(1);
  ParameterSet global = Filled(10, 0);
  const ParameterSet small = Filled(10, 0.01f);
  double last_clip = 5.0;
  for (int round = 1; round <= 5; ++round) {
    auto plan = s->ConfigureRound(round, all, rng);
    s->BeginRound(global, 1);
    for (int i = 0; i < 5; ++i) s->Accumulate(ClientUpdate::Unnamed(ViewsOf(small), 10), 0);
    ASSERT_TRUE(s->FinishRound(0, &global).ok());
    const auto stats = s->RoundStats();
    const double q = static_cast<double>(plan.clients.size()) / all.size();
    EXPECT_NEAR(stats.at("epsilon"), dp::ComputeEpsilon(q, 1.1, round, 1e-5)->epsilon, 1e-9);
    EXPECT_EQ(stats.at("delta"), 1e-5);
    EXPECT_NEAR(stats.at("dp_clip"), last_clip, 1e-5 * last_clip);
    last_clip = s->State().Find("dp/clip")->values[0];
  }
  EXPECT_LT(last_clip, 5.0) << "all updates far inside C: C shrinks";
  // The state round-trips, accountant included.
  auto copy = DpFedAvg("{noise_multiplier: 1.1, clip: 5.0, adaptive: true, clip_count_stddev: 1.0}", 4);
  ASSERT_TRUE(copy->Restore(s->State()).ok());
  EXPECT_NEAR(copy->RoundStats().at("epsilon"), s->RoundStats().at("epsilon"), 1e-6);
}

TEST(DpTest, TargetEpsilonStopsBeforeItIsExceeded) {
  auto s = DpFedAvg("{noise_multiplier: 1.0, clip: 1.0, target_epsilon: 10.0}", 3);
  std::mt19937_64 rng(1);
  ParameterSet global = Filled(4, 0);
  int rounds = 0;
  for (int round = 1; round <= 1000; ++round) {
    auto plan = s->ConfigureRound(round, {"a", "b"}, rng);
    if (!plan.stop_reason.empty()) break;
    s->BeginRound(global, 1);
    s->Accumulate(ClientUpdate::Unnamed(ViewsOf(Filled(4, 0.1f)), 1), 0);
    ASSERT_TRUE(s->FinishRound(0, &global).ok());
    ++rounds;
    EXPECT_LE(s->RoundStats().at("epsilon"), 10.0);
  }
  EXPECT_GT(rounds, 0);
  EXPECT_LT(rounds, 1000);
  EXPECT_GT(dp::ComputeEpsilon(1.0, 1.0, rounds + 1, 1e-5)->epsilon, 10.0) << "one more exceeds it";
}

}  // namespace
}  // namespace cleave
