#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>
#include <thread>

#include "aggregation/dp.h"
#include "aggregation/strategy.h"
#include "aggregation/weighting.h"
#include "job/job.h"

namespace cleave {
namespace {

ParameterSet Vec(float a, float b) {
  ParameterSet ps;
  EXPECT_TRUE(ps.Add({"w", {2}, {a, b}}).ok());
  return ps;
}

std::unique_ptr<Strategy> Make(const std::string& yaml) {
  auto c = ParseJob(yaml, "");
  EXPECT_TRUE(c.ok()) << c.status();
  auto s = CreateStrategy(StrategyJobOf(*c));
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

void Add(Strategy& s, const ParameterSet& delta, int64_t n) {
  std::string bytes = delta.Encode();
  auto views = ParseParameterSet(bytes);
  ASSERT_TRUE(views.ok());
  s.Accumulate(ClientUpdate::Unnamed(*views, n), 0);
}

// One round with the fixed updates: A = (1, -1) from 1 example, B = (3, 1) from 3.
// Their weighted mean is D = (2.5, 0.5).
void Round(Strategy& s, ParameterSet* global) {
  s.BeginRound(*global, 1);
  Add(s, Vec(1, -1), 1);
  Add(s, Vec(3, 1), 3);
  EXPECT_EQ(s.accumulated(), 2);
  ASSERT_TRUE(s.FinishRound(0, global).ok());
}

void ExpectNear(const ParameterSet& ps, double a, double b) {
  EXPECT_NEAR(ps.tensors()[0].values[0], a, 1e-5);
  EXPECT_NEAR(ps.tensors()[0].values[1], b, 1e-5);
}

TEST(FedAvgTest, WeightedMeanOfDeltas) {
  auto s = Make("strategy: {name: fedavg}");
  ParameterSet x = Vec(1, 2);
  Round(*s, &x);
  ExpectNear(x, 1 + 2.5, 2 + 0.5);
}

TEST(FedAvgTest, ThreeClientsUnequalWeights) {
  auto s = Make("");
  ParameterSet x = Vec(0, 0);
  s->BeginRound(x, 1);
  Add(*s, Vec(10, 0), 2);
  Add(*s, Vec(0, 10), 3);
  Add(*s, Vec(-5, 5), 5);
  ASSERT_TRUE(s->FinishRound(0, &x).ok());
  ExpectNear(x, (2 * 10.0 + 5 * -5.0) / 10, (3 * 10.0 + 5 * 5.0) / 10);
}

TEST(FedAvgTest, NoResultsKeepsTheModel) {
  auto s = Make("");
  ParameterSet x = Vec(1, 2);
  s->BeginRound(x, 1);
  Status st = s->FinishRound(3, &x);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  ExpectNear(x, 1, 2);
}

TEST(FedAvgTest, AccumulatorResetsBetweenRounds) {
  auto s = Make("");
  ParameterSet x = Vec(0, 0);
  Round(*s, &x);
  Round(*s, &x);
  ExpectNear(x, 5, 1);
}

TEST(FedAvgMTest, ServerMomentum) {
  auto s = Make("strategy: {name: fedavgm, server_momentum: 0.9, server_lr: 1.0}");
  ParameterSet x = Vec(1, 2);
  Round(*s, &x);  // v = D
  ExpectNear(x, 1 + 2.5, 2 + 0.5);
  Round(*s, &x);  // v = 0.9 D + D
  ExpectNear(x, 3.5 + 0.9 * 2.5 + 2.5, 2.5 + 0.9 * 0.5 + 0.5);
}

// DiLoCo's outer step: torch.optim.SGD(lr, momentum, nesterov=True) on the
// pseudo-gradient g = -D: b = beta b + g; x -= lr (g + beta b).
TEST(DiLoCoTest, OuterNesterovStep) {
  auto s = Make("strategy: {name: diloco}");  // lr 0.7, momentum 0.9 by default
  ParameterSet x = Vec(1, 2);
  double x0 = 1, b = 0;
  for (int r = 0; r < 3; ++r) {
    Round(*s, &x);  // D = 2.5 for the first coordinate
    const double g = -2.5;
    b = 0.9 * b + g;
    x0 -= 0.7 * (g + 0.9 * b);
    EXPECT_NEAR(x.tensors()[0].values[0], x0, 1e-5) << "round " << r;
  }
}

// Reddi et al. step with m0 = 0, v0 = tau^2, eta = 0.1, b1 = 0.9, b2 = 0.99, tau = 1e-3.
TEST(AdaptiveTest, FedAdamTwoRounds) {
  auto s = Make("strategy: {name: fedadam}");
  ParameterSet x = Vec(1, 2);
  const double tau = 1e-3;
  double x0 = 1, m = 0, v = tau * tau;
  for (int r = 0; r < 2; ++r) {
    Round(*s, &x);
    m = 0.9 * m + 0.1 * 2.5;
    v = 0.99 * v + 0.01 * 2.5 * 2.5;
    x0 += 0.1 * m / (std::sqrt(v) + tau);
    EXPECT_NEAR(x.tensors()[0].values[0], x0, 1e-5) << "round " << r;
  }
}

TEST(AdaptiveTest, FedYogiFirstStep) {
  auto s = Make("strategy: {name: fedyogi}");
  ParameterSet x = Vec(1, 2);
  Round(*s, &x);
  const double tau = 1e-3;
  // v = tau^2 - (1 - b2) D^2 sign(tau^2 - D^2) = tau^2 + 0.01 D^2 since D^2 > tau^2.
  const double v0 = tau * tau + 0.01 * 2.5 * 2.5, v1 = tau * tau + 0.01 * 0.5 * 0.5;
  ExpectNear(x, 1 + 0.1 * 0.25 / (std::sqrt(v0) + tau), 2 + 0.1 * 0.05 / (std::sqrt(v1) + tau));
}

TEST(AdaptiveTest, FedAdagradAccumulatesSquares) {
  auto s = Make("strategy: {name: fedadagrad, server_lr: 0.5}");
  ParameterSet x = Vec(1, 2);
  const double tau = 1e-3;
  double x0 = 1, m = 0, v = tau * tau;
  for (int r = 0; r < 2; ++r) {
    Round(*s, &x);
    m = 0.9 * m + 0.1 * 2.5;
    v = v + 2.5 * 2.5;
    x0 += 0.5 * m / (std::sqrt(v) + tau);
  }
  EXPECT_NEAR(x.tensors()[0].values[0], x0, 1e-5);
}

TEST(AdaptiveTest, StateRestoreContinuesExactly) {
  for (const std::string name : {"fedavgm", "diloco", "fedadam", "fedyogi", "fedadagrad"}) {
    SCOPED_TRACE(name);
    auto a = Make("strategy: {name: " + name + "}");
    ParameterSet xa = Vec(1, 2);
    Round(*a, &xa);
    auto b = Make("strategy: {name: " + name + "}");
    ASSERT_TRUE(b->Restore(a->State()).ok());
    ParameterSet xb = xa;
    Round(*a, &xa);
    Round(*b, &xb);
    EXPECT_EQ(xa.tensors()[0].values, xb.tensors()[0].values);
    auto fresh = Make("strategy: {name: " + name + "}");
    ParameterSet xf = Vec(1, 2);
    Round(*fresh, &xf);
    Round(*fresh, &xf);
    EXPECT_EQ(xa.tensors()[0].values, xf.tensors()[0].values);
  }
}

TEST(AdaptiveTest, RestoreRejectsForeignState) {
  auto s = Make("strategy: {name: fedadam}");
  ParameterSet bad;
  ASSERT_TRUE(bad.Add({"q/w", {1}, {0}}).ok());
  EXPECT_FALSE(s->Restore(bad).ok());
}

// EF21's server side: uploads are increments of each client's estimate; the model moves
// by the weighted mean estimate H every round, and H survives a restart.
TEST(Ef21Test, TheModelMovesByTheMeanEstimateEveryRound) {
  const std::string yaml = "compression: {update: \"topk:0.5:ef21\"}";
  auto s = Make(yaml);
  EXPECT_EQ(s->name(), "fedavg+ef21");
  ParameterSet x = Vec(0, 0);
  Round(*s, &x);  // H = (2.5, 0.5)
  ExpectNear(x, 2.5, 0.5);
  s->BeginRound(x, 1);  // no increments: H stays, and so does the model
  Add(*s, Vec(0, 0), 1);
  ASSERT_TRUE(s->FinishRound(0, &x).ok());
  ExpectNear(x, 5.0, 1.0);
  s->BeginRound(x, 1);  // one client (the other failed): H += (4, -4)
  Add(*s, Vec(4, -4), 2);
  ASSERT_TRUE(s->FinishRound(1, &x).ok());
  ExpectNear(x, 5.0 + 6.5, 1.0 - 3.5);

  auto restored = Make(yaml);
  ASSERT_TRUE(restored->Restore(s->State()).ok());
  ParameterSet a = x, b = x;
  for (auto* strategy : {s.get(), restored.get()}) {
    ParameterSet* m = strategy == s.get() ? &a : &b;
    strategy->BeginRound(*m, 1);
    Add(*strategy, Vec(1, 1), 1);
    ASSERT_TRUE(strategy->FinishRound(0, m).ok());
  }
  ExpectNear(a, 11.5 + 7.5, -2.5 - 2.5);
  EXPECT_EQ(a.tensors()[0].values, b.tensors()[0].values);
}

TEST(Ef21Test, AForeignEstimateIsRefused) {
  const std::string yaml = "compression: {update: \"topk:0.5:ef21\"}";
  auto s = Make(yaml);
  ParameterSet foreign;
  ASSERT_TRUE(foreign.Add({"ef21/w", {3}, {1, 2, 3}}).ok());
  ASSERT_TRUE(s->Restore(foreign).ok());
  ParameterSet x = Vec(1, 2);
  s->BeginRound(x, 1);
  Add(*s, Vec(1, 1), 1);
  EXPECT_EQ(s->FinishRound(0, &x).code(), absl::StatusCode::kFailedPrecondition);
  ExpectNear(x, 1, 2);
}

TEST(Ef21Test, NoResultsKeepTheModel) {
  auto s = Make("compression: {update: \"topk:0.5:ef21\"}");
  ParameterSet x = Vec(1, 2);
  Round(*s, &x);
  s->BeginRound(x, 1);
  EXPECT_EQ(s->FinishRound(2, &x).code(), absl::StatusCode::kFailedPrecondition);
  ExpectNear(x, 3.5, 2.5);
}

TEST(FedProxTest, SendsProximalTermToClients) {
  auto s = Make("strategy: {name: fedprox, proximal_mu: 0.01}");
  std::mt19937_64 rng(1);
  RoundPlan plan = s->ConfigureRound(1, {"c1", "c2"}, rng);
  EXPECT_DOUBLE_EQ(plan.fit.proximal_mu, 0.01);
  auto avg = Make("strategy: {name: fedavg, proximal_mu: 0.01}");
  EXPECT_DOUBLE_EQ(avg->ConfigureRound(1, {"c1"}, rng).fit.proximal_mu, 0.0);
}

TEST(SelectionTest, SamplesDistinctClientsReproducibly) {
  auto s = Make("clients: {per_round: 3}");
  std::vector<std::string> all;
  for (int i = 0; i < 10; ++i) all.push_back("c" + std::to_string(i));
  std::mt19937_64 r1(5), r2(5);
  auto a = s->ConfigureRound(1, all, r1).clients;
  auto b = s->ConfigureRound(1, all, r2).clients;
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(std::set<std::string>(a.begin(), a.end()).size(), 3u);
  std::set<std::vector<std::string>> distinct;
  for (int i = 0; i < 20; ++i) distinct.insert(s->ConfigureRound(1, all, r1).clients);
  EXPECT_GT(distinct.size(), 1u) << "sampling must vary across rounds";

  auto half = Make("clients: {fraction: 0.5}");
  EXPECT_EQ(half->ConfigureRound(1, all, r1).clients.size(), 5u);
  auto many = Make("clients: {per_round: 50}");
  EXPECT_EQ(many->ConfigureRound(1, all, r1).clients.size(), 10u);
}

// The weight bound every strategy sees (aggregation/weighting.h).
TEST(RoundWeightsTest, CapsAtAMultipleOfTheMedianDeclaredCount) {
  AggregationConfig c;  // examples, ratio 3
  RoundWeights w(c, {100, 1000000000000, 200});
  EXPECT_EQ(w.cap(), 600);
  EXPECT_EQ(w.Weight(150), 150);
  EXPECT_EQ(w.Weight(1000000000000), 600);
  EXPECT_EQ(w.Weight(0), 1) << "a weight is at least 1";
  RoundWeights even(c, {100, 200, 300, 1000});  // median 250
  EXPECT_EQ(even.cap(), 750);
  c.max_client_examples = 400;
  EXPECT_EQ(RoundWeights(c, {100, 200, 300, 1000}).cap(), 400);
  c.max_weight_ratio = 0;
  c.max_client_examples = 0;
  EXPECT_EQ(RoundWeights(c, {100, 1000000000000}).Weight(1000000000000), 1000000000000)
      << "no cap when the operator turns both off";
  c.weighting = "equal";
  RoundWeights eq(c, {100, 200});
  EXPECT_TRUE(eq.equal());
  EXPECT_EQ(eq.Weight(12345), 1);
}

// Shards: results added by four threads at once, each into its own partial aggregate,
// make the model one thread adding them all into one makes (to float summation order),
// for every strategy and wrapper; a shard left empty contributes nothing.
TEST(ShardsTest, ConcurrentPartialSumsMergeIntoTheSerialResult) {
  const int kResults = 12;
  std::vector<ParameterSet> deltas;
  for (int i = 0; i < kResults; ++i) {
    ParameterSet d;
    std::vector<float> v(1000);
    for (size_t j = 0; j < v.size(); ++j) v[j] = std::sin(0.37f * (i + 1) * (j + 3)) * 0.1f;
    ASSERT_TRUE(d.Add({"w", {1000}, v}).ok());
    deltas.push_back(std::move(d));
  }
  DpConfig dp;
  dp.enabled = true;
  dp.clip = 1.0;
  dp.noise_multiplier = 1e-9;
  const std::vector<std::pair<std::string, std::function<std::unique_ptr<Strategy>()>>> kinds = {
      {"fedavg", [] { return Make(""); }},
      {"fedadam", [] { return Make("strategy: {name: fedadam}"); }},
      {"ef21", [] { return Make("compression: {update: \"topk:0.5:ef21\"}"); }},
      {"median", [] { return Make("aggregation: {rule: median}"); }},
      {"dp", [&] { return MakeDpStrategy(Make(""), dp, 1); }},
  };
  for (const auto& [name, make] : kinds) {
    ParameterSet serial, sharded;
    ASSERT_TRUE(serial.Add({"w", {1000}, std::vector<float>(1000, 0.5f)}).ok());
    sharded = serial;
    auto one = make(), four = make();
    one->BeginRound(serial, 1);
    for (int i = 0; i < kResults; ++i) {
      one->Accumulate(ClientUpdate::Unnamed(ViewsOf(deltas[i]), i + 1), 0);
    }
    four->BeginRound(sharded, 5);  // shard 4 stays empty
    std::vector<std::thread> threads;
    for (int shard = 0; shard < 4; ++shard) {
      threads.emplace_back([&, shard] {
        for (int i = shard; i < kResults; i += 4) {
          four->Accumulate(ClientUpdate::Unnamed(ViewsOf(deltas[i]), i + 1), shard);
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(four->accumulated(), kResults) << name;
    ASSERT_TRUE(one->FinishRound(0, &serial).ok()) << name;
    ASSERT_TRUE(four->FinishRound(0, &sharded).ok()) << name;
    double moved = 0;
    for (size_t j = 0; j < 1000; ++j) {
      moved = std::max(moved, std::abs(serial.tensors()[0].values[j] - 0.5));
      ASSERT_NEAR(sharded.tensors()[0].values[j], serial.tensors()[0].values[j], 1e-5)
          << name << " at " << j;
    }
    EXPECT_GT(moved, 1e-3) << name;
  }
}

// The default evaluation summary: weighted by examples, spread over clients.
TEST(EvaluationSummaryTest, WeighsByExamplesAndSpreadsOverClients) {
  std::vector<ClientEvaluationResult> r(3);
  r[0].examples = 10, r[0].accuracy = 0.5, r[0].loss = 2, r[0].seconds = 1, r[0].metrics["f1"] = 0.4;
  r[1].examples = 30, r[1].accuracy = 0.9, r[1].loss = 1, r[1].seconds = 3;
  r[2].examples = 60, r[2].accuracy = 0.7, r[2].loss = 4, r[2].seconds = 2, r[2].metrics["f1"] = 0.6;
  const EvaluationSummary e = SummariseEvaluations(r);
  EXPECT_EQ(e.clients, 3);
  EXPECT_EQ(e.examples, 100);
  EXPECT_DOUBLE_EQ(e.accuracy, (5 + 27 + 42) / 100.0);
  EXPECT_DOUBLE_EQ(e.loss, (20 + 30 + 240) / 100.0);
  EXPECT_DOUBLE_EQ(e.accuracy_min, 0.5);
  EXPECT_DOUBLE_EQ(e.accuracy_median, 0.7);
  EXPECT_DOUBLE_EQ(e.loss_max, 4);
  EXPECT_DOUBLE_EQ(e.seconds, 2);
  EXPECT_DOUBLE_EQ(e.metrics.at("f1"), (4 + 36) / 70.0) << "over the clients that report it";
  EXPECT_EQ(SummariseEvaluations({}).clients, 0);
}

// Clients name their own metrics: however many names they send, a round keeps the 64
// that the most examples measured.
TEST(EvaluationSummaryTest, KeepsTheMetricsTheMostExamplesMeasured) {
  std::vector<ClientEvaluationResult> r(100);
  for (int i = 0; i < 100; ++i) {
    r[i].examples = 1;
    r[i].metrics["shared"] = i;
    r[i].metrics["own_" + std::to_string(i)] = 1.0;  // a name of each client's own
  }
  r[99].examples = 2;
  const EvaluationSummary e = SummariseEvaluations(r);
  EXPECT_EQ(e.metrics.size(), kMaxSummaryMetrics);
  EXPECT_EQ(e.metrics.count("shared"), 1u);
  EXPECT_EQ(e.metrics.count("own_99"), 1u);  // two examples: before the others of one
  EXPECT_DOUBLE_EQ(e.metrics.at("shared"), (4950.0 + 99) / 101);
}

}  // namespace
}  // namespace cleave
