// Hierarchical aggregation: two edge aggregators, each with two clients, under one top
// coordinator make the model four clients make under the top alone.
#include <gtest/gtest.h>

#include <thread>

#include "server/edge.h"
#include "tests/integration/federation.h"
#include "tests/server/test_peer.h"

namespace cleave {
namespace {

constexpr char kTop[] = R"(
model: {name: mlp}
run: {rounds: 2, seed: 5}
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

TEST(EdgeTest, TwoLevelsMakeTheFlatModel) {
  SetTorchThreads(1);
  std::vector<ClientOptions> data = Options(4, 2000);
  for (size_t i = 0; i < data.size(); ++i) data[i].name = "client-" + std::to_string(i);

  // Flat: the four clients under the top coordinator.
  ParameterSet flat;
  {
    Federation f;
    f.Start(std::string(kTop) + "clients: {min: 4, quorum: 1.0}\n", data);
    f.Join();
    ASSERT_TRUE(f.server_status.ok()) << f.server_status;
    flat = f.server->GlobalModel();
  }

  // Two levels: the top sees two clients, the edges; each edge two of the four.
  auto clock = std::make_shared<FakeClock>();
  auto top = StartServer(std::string(kTop) + "clients: {min: 2, quorum: 1.0}\n", clock);
  ASSERT_TRUE(top);
  const ParameterSet initial = top->GlobalModel();
  Status top_status;
  std::thread top_thread([&] { top_status = top->Run(); });
  const std::string edge_yaml =
      "model: {name: mlp}\ndata: {test: \"\"}\nclients: {min: 2, quorum: 1.0}\n"
      "server: {heartbeat_s: 0.5, client_timeout_s: 30}\n";
  ASSERT_TRUE(CheckEdgeConfig(TestConfig(edge_yaml)).ok());
  std::vector<std::unique_ptr<Server>> edges;
  std::vector<std::unique_ptr<Edge>> edge_runs;
  std::vector<Status> edge_status(2);
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<Status> client_status(4);
  for (int e = 0; e < 2; ++e) {
    edges.push_back(StartServer(edge_yaml, clock));
    ASSERT_TRUE(edges.back());
    ClientOptions up;
    up.server = Address(*top);
    up.name = "edge-" + std::to_string(e);
    up.insecure = true;
    edge_runs.push_back(std::make_unique<Edge>(edges.back().get(), std::move(up)));
    for (int i = 2 * e; i < 2 * e + 2; ++i) {
      ClientOptions o = data[i];
      o.server = Address(*edges.back());
      o.insecure = true;
      clients.push_back(std::make_unique<Client>(std::move(o)));
    }
  }
  for (int e = 0; e < 2; ++e) {
    threads.emplace_back([&, e] { edge_status[e] = edge_runs[e]->Run(); });
  }
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { client_status[i] = clients[i]->Run(); });
  }
  top_thread.join();
  for (auto& t : threads) t.join();
  ASSERT_TRUE(top_status.ok()) << top_status;
  for (const auto& s : edge_status) EXPECT_TRUE(s.ok()) << s;
  for (const auto& s : client_status) EXPECT_TRUE(s.ok()) << s << " (told the run ended)";
  auto h = top->History();
  ASSERT_GE(h.size(), 2u);
  EXPECT_EQ(h[0].participants, 2);
  EXPECT_EQ(h[0].examples, 4 * 500) << "each edge claims its clients' examples";
  for (const auto& e : edges) EXPECT_EQ(e->committed_round(), 2);

  const ParameterSet two_level = top->GlobalModel();
  ASSERT_TRUE(two_level.SameLayout(flat));
  double max_diff = 0, max_abs = 0, trained = 0;
  for (size_t i = 0; i < flat.size(); ++i) {
    for (size_t j = 0; j < flat.tensors()[i].values.size(); ++j) {
      const float f = flat.tensors()[i].values[j];
      max_diff = std::max(max_diff, static_cast<double>(std::abs(f - two_level.tensors()[i].values[j])));
      max_abs = std::max(max_abs, static_cast<double>(std::abs(f)));
      trained = std::max(trained, static_cast<double>(std::abs(f - initial.tensors()[i].values[j])));
    }
  }
  EXPECT_LT(max_diff, 1e-5 * std::max(1.0, max_abs));
  EXPECT_GT(trained, 1e-2) << "two rounds moved the model from where both runs started";
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

TEST(EdgeTest, AnEdgeMustHandUpAPlainMean) {
  EXPECT_FALSE(CheckEdgeConfig(TestConfig("strategy: {name: fedadam}\n")).ok());
  EXPECT_FALSE(CheckEdgeConfig(TestConfig("strategy: {name: fedavg, server_lr: 0.5}\n")).ok());
  EXPECT_FALSE(CheckEdgeConfig(TestConfig("aggregation: {rule: median}\n")).ok());
  EXPECT_FALSE(CheckEdgeConfig(TestConfig("dp: {noise_multiplier: 1, clip: 1}\n")).ok());
  EXPECT_FALSE(CheckEdgeConfig(TestConfig("scheduler: {mode: async}\n")).ok());
  EXPECT_FALSE(CheckEdgeConfig(TestConfig("secure_aggregation: {}\n")).ok());
  EXPECT_TRUE(CheckEdgeConfig(TestConfig("strategy: {name: fedavg}\n")).ok());
  auto shipped = JobConfig::Load(CLEAVE_SOURCE_DIR "/deploy/examples/fmnist-edge.yaml");
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  EXPECT_TRUE(CheckEdgeConfig(*shipped).ok()) << CheckEdgeConfig(*shipped);
}

}  // namespace
}  // namespace cleave
