// Hierarchical aggregation: two edge aggregators, each with two clients, under one top
// coordinator make the model four clients make under the top alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "edge/edge.h"
#include "job/job.h"
#include "tests/integration/federation.h"
#include "tests/server/test_peer.h"

namespace cleave {
namespace {

constexpr char kTop[] = R"(
model: {name: mlp}
data: {test_limit: 500}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
server: {heartbeat_s: 0.5, client_timeout_s: 30}
)";

std::unique_ptr<Server> StartServer(const std::string& yaml, std::shared_ptr<Clock> clock) {
  ServerOptions o;
  o.config = TestConfig(yaml);
  o.listen = "127.0.0.1:0";
  o.insecure = true;
  o.clock = std::move(clock);
  auto s = Server::Create(std::move(o));
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return nullptr;
  EXPECT_TRUE((*s)->Start().ok());
  return *std::move(s);
}

std::string Address(const Server& s) { return "127.0.0.1:" + std::to_string(s.port()); }

// The flat federation of `data` under one coordinator for `rounds` rounds, and the same
// clients under `edges` edge aggregators (client i under edge i mod edges) that join one
// top coordinator; `top` and `edge` are the two levels' extra configuration, `flat` the
// flat one's.
struct TwoRuns {
  ParameterSet initial, flat, two_level;
  std::vector<RoundMetrics> top_history;
  std::vector<int64_t> edge_rounds;
};

TwoRuns RunFlatAndTwoLevels(const std::vector<ClientOptions>& data, int edges, int rounds,
                            const std::string& top, const std::string& edge, const std::string& flat = "") {
  SetTorchThreads(1);
  const int n = static_cast<int>(data.size());
  TwoRuns out;
  {
    Federation f;
    f.Start(absl::StrCat(kTop, "run: {rounds: ", rounds, ", seed: 5}\nclients: {min: ", n,
                         ", quorum: 1.0}\n", flat),
            data);
    f.Join();
    EXPECT_TRUE(f.server_status.ok()) << f.server_status;
    out.flat = f.server->GlobalModel();
  }
  auto clock = std::make_shared<FakeClock>();
  auto top_server =
      StartServer(absl::StrCat(kTop, "run: {rounds: ", rounds, ", seed: 5}\nclients: {min: ", edges,
                               ", quorum: 1.0}\n", top),
                  clock);
  if (!top_server) return out;
  out.initial = top_server->GlobalModel();
  Status top_status;
  std::thread top_thread([&] { top_status = top_server->Run(); });
  const std::string edge_yaml = absl::StrCat(
      "model: {name: mlp}\ndata: {test: \"\"}\nclients: {min: ", n / edges,
      ", quorum: 1.0}\nserver: {heartbeat_s: 0.5, client_timeout_s: 30}\n", edge);
  EXPECT_TRUE(CheckEdgeConfig(TestConfig(edge_yaml)).ok()) << CheckEdgeConfig(TestConfig(edge_yaml));
  std::vector<std::unique_ptr<Server>> edge_servers;
  std::vector<std::unique_ptr<Edge>> edge_runs;
  std::vector<Status> edge_status(edges), client_status(n);
  std::vector<std::unique_ptr<Client>> clients;
  for (int e = 0; e < edges; ++e) {
    edge_servers.push_back(StartServer(edge_yaml, clock));
    if (!edge_servers.back()) break;
    ClientOptions up;
    up.server = Address(*top_server);
    up.name = "edge-" + std::to_string(e);
    up.insecure = true;
    edge_runs.push_back(std::make_unique<Edge>(edge_servers.back().get(), std::move(up)));
  }
  if (static_cast<int>(edge_runs.size()) == edges) {
    for (int i = 0; i < n; ++i) {
      ClientOptions o = data[i];
      o.server = Address(*edge_servers[i % edges]);
      o.insecure = true;
      clients.push_back(std::make_unique<Client>(std::move(o)));
    }
    std::vector<std::thread> threads;
    for (int e = 0; e < edges; ++e) {
      threads.emplace_back([&, e] { edge_status[e] = edge_runs[e]->Run(); });
    }
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] { client_status[i] = clients[i]->Run(); });
    }
    for (auto& t : threads) t.join();
  } else {
    top_server->Stop();
  }
  top_thread.join();
  EXPECT_TRUE(top_status.ok()) << top_status;
  for (const auto& s : edge_status) EXPECT_TRUE(s.ok()) << s;
  for (const auto& s : client_status) EXPECT_TRUE(s.ok()) << s << " (told the run ended)";
  out.two_level = top_server->GlobalModel();
  out.top_history = top_server->History();
  for (const auto& e : edge_servers) out.edge_rounds.push_back(e->committed_round());
  return out;
}

struct Diff {
  double max_diff = 0, max_abs = 0, trained = 0;
};

Diff Compare(const TwoRuns& r) {
  Diff d;
  EXPECT_TRUE(r.two_level.SameLayout(r.flat));
  if (!r.two_level.SameLayout(r.flat) || !r.initial.SameLayout(r.flat)) return d;
  for (size_t i = 0; i < r.flat.size(); ++i) {
    for (size_t j = 0; j < r.flat.tensors()[i].values.size(); ++j) {
      const double f = r.flat.tensors()[i].values[j];
      d.max_diff = std::max(d.max_diff, std::abs(f - r.two_level.tensors()[i].values[j]));
      d.max_abs = std::max(d.max_abs, std::abs(f));
      d.trained = std::max(d.trained, std::abs(f - r.initial.tensors()[i].values[j]));
    }
  }
  return d;
}

std::vector<ClientOptions> Named(std::vector<ClientOptions> data) {
  for (size_t i = 0; i < data.size(); ++i) data[i].name = "client-" + std::to_string(i);
  return data;
}

// Two edges with two clients each make the model the four make under the top alone.
TEST(EdgeTest, TwoLevelsMakeTheFlatModel) {
  const TwoRuns r = RunFlatAndTwoLevels(Named(Options(4, 2000)), 2, 2, "", "");
  ASSERT_GE(r.top_history.size(), 2u);
  EXPECT_EQ(r.top_history[0].participants, 2);
  EXPECT_EQ(r.top_history[0].examples, 4 * 500) << "each edge claims its clients' examples";
  for (int64_t rounds : r.edge_rounds) EXPECT_EQ(rounds, 2);
  const Diff d = Compare(r);
  EXPECT_LT(d.max_diff, 1e-5 * std::max(1.0, d.max_abs));
  EXPECT_GT(d.trained, 1e-2) << "two rounds moved the model from where both runs started";
}

// Width-scaled submodels under edges: each edge hands up its devices' per-element mean
// with each element's share of its weight, and the top combines the edges' means per
// element; two edges with devices of widths 1, 1/2 and 1/4 make the model the four make
// under the top alone.
TEST(EdgeTest, EdgesOfSubmodelsMakeTheFlatModel) {
  const std::string widths =
      "width: {clients: [{name: client-1, rate: 0.5}, {name: client-2, rate: 0.25}, {name: client-3, rate: 0.5}]}\n";
  const TwoRuns r = RunFlatAndTwoLevels(Named(Options(4, 2000)), 2, 2, "width: {}\n", widths, widths);
  ASSERT_GE(r.top_history.size(), 2u);
  EXPECT_EQ(r.top_history[0].participants, 2);
  EXPECT_EQ(r.top_history[0].widths, (std::map<std::string, double>{{"edge-0", 1.0}, {"edge-1", 1.0}}));
  const Diff d = Compare(r);
  EXPECT_LT(d.max_diff, 1e-5 * std::max(1.0, d.max_abs));
  EXPECT_GT(d.trained, 1e-2) << "two rounds moved the model from where both runs started";
}

// Secure aggregation at both levels: each edge sees only its clients' masked sum, the top
// only the edges' masked sum (SecAgg+ needs more than t = 2 inputs: three edges of three
// clients). One round, so the bound is exact: each level's stochastic rounding moves a
// mean by less than one step, 2 clip / (2^16 - 1) = 3.05e-5, so the model is the flat
// plain one within two steps. (Over more rounds the rounding's effect on the next round's
// training grows beyond that bound: 6.2e-4 after two.)
TEST(EdgeTest, SecureAggregationAtBothLevelsMakesTheFlatModel) {
  constexpr char kSecAgg[] = "secure_aggregation: {k: 2, t: 2, clip: 1.0, bits: 16}\n";
  const TwoRuns r = RunFlatAndTwoLevels(Named(Options(9, 2700)), 3, 1, kSecAgg, kSecAgg);
  ASSERT_EQ(r.top_history.size(), 1u);
  EXPECT_EQ(r.top_history[0].participants, 3);
  EXPECT_EQ(r.top_history[0].failures, 0);
  for (int64_t rounds : r.edge_rounds) EXPECT_EQ(rounds, 1);
  const Diff d = Compare(r);
  EXPECT_GT(d.trained, 1e-2) << "the round moved the model from where both runs started";
  EXPECT_LT(d.max_diff, 2 * 2.0 / 65535 + 1e-6);
  EXPECT_GT(d.max_diff, 0) << "the updates really went through quantization";
}

// An edge joins upstream declaring the examples of the clients it has; when a client joins
// it later, the round that first includes it is claimed at the old declaration (the
// upstream refuses more), and the edge then joins again declaring the new total.
TEST(EdgeTest, AnEdgeDeclaresClientsThatJoinedAfterIt) {
  SetTorchThreads(1);
  std::vector<ClientOptions> data = Options(2, 1000);  // 500 examples each
  auto clock = std::make_shared<FakeClock>();
  auto top = StartServer(
      "model: {name: mlp}\nrun: {rounds: 6, seed: 5}\ndata: {test_limit: 200}\n"
      "train: {local_epochs: 1, batch_size: 64, lr: 0.05}\n"
      "server: {heartbeat_s: 0.5, client_timeout_s: 30}\nclients: {min: 1, quorum: 1.0}\n",
      clock);
  ASSERT_TRUE(top);
  auto edge = StartServer("model: {name: mlp}\ndata: {test: \"\"}\nclients: {min: 1, quorum: 1.0}\n"
                          "server: {heartbeat_s: 0.5, client_timeout_s: 30}\n",
                          clock);
  ASSERT_TRUE(edge);
  ClientOptions up;
  up.server = Address(*top);
  up.name = "edge";
  up.insecure = true;
  up.initial_backoff_s = 0.05;
  Edge edge_run(edge.get(), std::move(up));
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 2; ++i) {
    ClientOptions o = data[i];
    o.name = "client-" + std::to_string(i);
    o.server = Address(*edge);
    o.insecure = true;
    clients.push_back(std::make_unique<Client>(std::move(o)));
  }
  Status top_status, edge_status, first_status, second_status;
  std::thread top_thread([&] { top_status = top->Run(); });
  std::thread edge_thread([&] { edge_status = edge_run.Run(); });
  std::thread first([&] { first_status = clients[0]->Run(); });
  // The second client joins once the top committed a round of the first alone.
  for (int i = 0; i < 6000 && top->committed_round() < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(top->committed_round(), 1);
  std::thread second([&] { second_status = clients[1]->Run(); });
  top_thread.join();
  for (std::thread* t : {&edge_thread, &first, &second}) t->join();
  ASSERT_TRUE(top_status.ok()) << top_status;
  EXPECT_TRUE(edge_status.ok()) << edge_status;
  EXPECT_TRUE(first_status.ok()) << first_status;
  EXPECT_TRUE(second_status.ok()) << second_status;

  auto h = top->History();
  ASSERT_EQ(h.size(), 6u);
  EXPECT_EQ(h[0].examples, 500) << "the edge joined with one client";
  for (const auto& r : h) {
    EXPECT_EQ(r.participants, 1);
    EXPECT_LE(r.examples, 1000);
  }
  EXPECT_EQ(h.back().examples, 1000) << "the edge declared its second client's examples";
}

// An edge is one client to its upstream, and its example count is its own word: the
// upstream bounds it as any client's, at max_weight_ratio (3) x the median count its
// round's clients declared. Two honest edges of 500 examples hand up a zero update, a
// lying one declares and claims 10^9 with an update of 1.0 in every coordinate: it
// weighs 3 x 500, so the model moves by 1,500 / 2,500 = 0.6, not by almost 1.
TEST(EdgeTest, AnEdgeThatLiesAboutItsExamplesWeighsAtMostTheCap) {
  SetTorchThreads(1);
  auto top = StartServer(absl::StrCat(kTop, "run: {rounds: 1, seed: 5}\nclients: {min: 3, quorum: 1.0}\n"),
                         std::make_shared<FakeClock>());
  ASSERT_TRUE(top);
  const ParameterSet initial = top->GlobalModel();
  Status top_status;
  std::thread top_thread([&] { top_status = top->Run(); });
  std::vector<std::unique_ptr<Client>> edges;
  for (int e = 0; e < 3; ++e) {
    const bool liar = e == 2;
    ClientOptions o;
    o.server = Address(*top);
    o.name = "edge-" + std::to_string(e);
    o.insecure = true;
    o.declared_examples = liar ? 1000000000 : 500;
    o.aggregate = [liar](const v1::Task&, const ParameterSet& model) -> StatusOr<ClientOptions::Aggregate> {
      ParameterSet delta = model.ZerosLike();
      for (auto& t : delta.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), liar ? 1.0f : 0.0f);
      return ClientOptions::Aggregate{std::move(delta), liar ? 1000000000 : 500, 0.1, ParameterSet()};
    };
    edges.push_back(std::make_unique<Client>(std::move(o)));
  }
  std::vector<Status> status(edges.size());
  std::vector<std::thread> threads;
  for (size_t e = 0; e < edges.size(); ++e) threads.emplace_back([&, e] { status[e] = edges[e]->Run(); });
  top_thread.join();
  for (auto& t : threads) t.join();
  ASSERT_TRUE(top_status.ok()) << top_status;
  for (const Status& s : status) EXPECT_TRUE(s.ok()) << s;
  ASSERT_EQ(top->History().size(), 1u);
  EXPECT_EQ(top->History()[0].examples, 2500);
  const ParameterSet model = top->GlobalModel();
  for (size_t i = 0; i < model.size(); ++i) {
    for (size_t j = 0; j < model.tensors()[i].values.size(); ++j) {
      ASSERT_NEAR(model.tensors()[i].values[j] - initial.tensors()[i].values[j], 0.6, 1e-5);
    }
  }
}

TEST(EdgeTest, AnEdgeMustHandUpAPlainMean) {
  EXPECT_FALSE(CheckEdgeConfig(TestConfig("strategy: {name: fedadam}\n")).ok());
  EXPECT_FALSE(CheckEdgeConfig(TestConfig("strategy: {name: fedavg, server_lr: 0.5}\n")).ok());
  EXPECT_FALSE(CheckEdgeConfig(TestConfig("aggregation: {rule: median}\n")).ok());
  EXPECT_FALSE(CheckEdgeConfig(TestConfig("dp: {noise_multiplier: 1, clip: 1}\n")).ok());
  EXPECT_FALSE(CheckEdgeConfig(TestConfig("scheduler: {mode: async}\n")).ok());
  EXPECT_TRUE(CheckEdgeConfig(TestConfig("secure_aggregation: {}\n")).ok());
  EXPECT_TRUE(CheckEdgeConfig(TestConfig("width: {method: fedrolex, rate: 0.5}\n")).ok());
  EXPECT_FALSE(CheckEdgeConfig(TestConfig("width: {rate: 0.5}\nsecure_aggregation: {}\n")).ok());
  EXPECT_TRUE(CheckEdgeConfig(TestConfig("strategy: {name: fedavg}\n")).ok());
  auto shipped = LoadJob(CLEAVE_SOURCE_DIR "/deploy/examples/fmnist-edge.yaml");
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  EXPECT_TRUE(CheckEdgeConfig(*shipped).ok()) << CheckEdgeConfig(*shipped);
}

}  // namespace
}  // namespace cleave
