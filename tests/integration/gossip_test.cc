// Decentralised rounds (scheduler.mode: gossip) with real clients: each serves Peer on
// loopback, trains, exchanges its model with its neighbours and averages; the server
// coordinates only and never receives a trained model.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tests/deadline.h"
#include "tests/integration/federation.h"

namespace cleave {
namespace {

constexpr char kGossip[] = R"(
data: {test: ""}
model: {name: mlp}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
server: {heartbeat_s: 0.5, client_timeout_s: 30, evaluate: false}
)";

std::vector<ClientOptions> GossipClients(int n, int64_t examples, double holdout = 0) {
  auto opts = Options(n, examples);
  for (auto& o : opts) {
    o.peer_listen = "127.0.0.1:0";
    if (holdout > 0) {
      const int64_t keep = static_cast<int64_t>(o.train.size * (1 - holdout));
      std::vector<int64_t> train(keep), held(o.train.size - keep);
      for (int64_t i = 0; i < o.train.size; ++i) (i < keep ? train[i] : held[i - keep]) = i;
      o.holdout = o.train.Subset(held);
      o.train = o.train.Subset(train);
    }
  }
  return opts;
}

// Two clients are one edge with weight 1/2: after a round both hold the same average of
// their trained models, which differs from the initial model; the server's model is
// still the initial one, its uploads are empty parameter sets, and the report says one
// neighbour heard by each.
TEST(GossipTest, TwoNeighboursHoldTheSameAverage) {
  Federation f;
  f.Start(std::string(kGossip) +
              "run: {rounds: 1, seed: 5}\nclients: {min: 2, quorum: 1.0}\n"
              "scheduler: {mode: gossip}\n",
          GossipClients(2, 400));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
  const ParameterSet a = f.clients[0]->GossipModel(), b = f.clients[1]->GossipModel();
  ASSERT_GT(a.size(), 0u);
  ASSERT_TRUE(a.SameLayout(b));
  EXPECT_LT(MaxDiff(a, b), 1e-6) << "the same weights of the same two models";
  const ParameterSet initial = f.server->GlobalModel();
  EXPECT_GT(MaxDiff(a, initial), 1e-3) << "the clients trained";
  auto h = f.server->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_TRUE(h[0].gossip.has_value());
  EXPECT_EQ(h[0].participants, 2);
  EXPECT_EQ(h[0].gossip.value().neighbours, 2);
  EXPECT_EQ(h[0].gossip.value().heard, 2);
  EXPECT_GT(h[0].gossip.value().disagreement, 0);
  const int64_t model_bytes = static_cast<int64_t>(initial.EncodedSize());
  EXPECT_EQ(h[0].gossip.value().peer_bytes, 2 * model_bytes);
  EXPECT_EQ(h[0].update_bytes, 2 * static_cast<int64_t>(ParameterSet().EncodedSize()))
      << "no trained model reaches the server";
}

// Four clients on a ring learn over rounds: their held-out accuracy rises and their
// models draw together.
TEST(GossipTest, ARingOfClientsLearns) {
  Federation f;
  f.Start(std::string(kGossip) +
              "run: {rounds: 3, seed: 5}\nclients: {min: 4, quorum: 1.0}\n"
              "scheduler: {mode: gossip, topology: ring}\n",
          GossipClients(4, 2000, 0.2));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
  auto h = f.server->History();
  ASSERT_EQ(h.size(), 3u);
  for (const auto& m : h) {
    EXPECT_EQ(m.gossip.value().heard, 8);
    EXPECT_EQ(m.client_eval.clients, 4);
  }
  // Round r's evaluation measures the models the clients held when it began.
  EXPECT_GT(h[1].client_eval.accuracy, h[0].client_eval.accuracy + 0.2);
  EXPECT_GT(h[2].client_eval.accuracy, h[1].client_eval.accuracy);
}


// scheduler.topology: measured. Round 1 is the ring (nothing measured); client 0's uplink
// is emulated at 16 Mbit/s, the others' are loopback's, so from round 2 the four fast
// clients take the edges among them they afford in the time client 0 needs for its two
// ring sends (a ring of 5 and three more edges), and client 0 keeps two neighbours.
TEST(GossipTest, MeasuredUplinksGiveFastClientsMoreNeighbours) {
  auto clients = GossipClients(5, 2000);
  // Under a sanitizer loopback itself is tens of times slower: so is the slow uplink.
  const double slow_mbps = 16.0 / testing::kSanitizerSlowdown;
  clients[0].emulation.uplink_mbps = slow_mbps;
  Federation f;
  f.Start(std::string(kGossip) +
              "run: {rounds: 3, seed: 5}\nclients: {min: 5, quorum: 1.0}\n"
              "scheduler: {mode: gossip, topology: measured, degree: 4}\n",
          std::move(clients));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
  auto h = f.server->History();
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0].gossip.value().neighbours, 10) << "round 1: the ring";
  EXPECT_EQ(h[1].gossip.value().neighbours, 16) << "the ring and the edges the fast clients afford";
  EXPECT_EQ(h[2].gossip.value().neighbours, 16);
  for (const auto& m : h) EXPECT_EQ(m.gossip.value().heard, m.gossip.value().neighbours);
  // The uplink each client measured itself, as its metrics report it.
  const double slow = f.clients[0]->State().gossip_uplink_mbps;
  EXPECT_GT(slow, slow_mbps / 2);
  EXPECT_LT(slow, slow_mbps * 1.25) << "the emulated uplink";
  for (size_t i = 1; i < f.clients.size(); ++i) {
    EXPECT_GT(f.clients[i]->State().gossip_uplink_mbps, 4 * slow) << i;
  }
}

// One hostile device of six (client-5, cleave-client --attack gaussian) sends its
// neighbours a finite poisoned model every round: the model it holds plus Gaussian noise
// of unit variance. On a random graph of degree 4, after five rounds, the honest five's
// models on 2,000 test images: under plain gossip the poison reaches them (a neighbour's
// training diverges; its task fails, and it still sends the model it holds, so nobody
// waits for the deadline; when every task of a round diverges the run ends early) and
// their accuracy falls by more than 10 points; self-centred
// clipping and the trimmed mean keep it within 2 points of the same federation with no
// attacker.
TEST(GossipTest, RobustRulesKeepHonestAccuracyAgainstAPoisoningNeighbour) {
  const Dataset test = *LoadFashionMnist(kFmnist, false, 2000);
  constexpr int kClients = 6, kHostile = kClients - 1;
  auto honest_accuracy = [&](const std::string& rule, bool attacked) {
    auto clients = GossipClients(kClients, 6000);
    if (attacked) clients[kHostile].attack = "gaussian";
    Federation f;
    f.Start(std::string(kGossip) +
                "run: {rounds: 5, seed: 5}\nclients: {min: 6, quorum: 0.5}\n"
                "scheduler: {mode: gossip, topology: random, degree: 4, gossip_rule: " + rule + "}\n",
            std::move(clients));
    f.Join();
    const auto h = f.server->History();
    if (rule == "mean" && attacked && !f.server_status.ok()) {
      // The poison can make every client's training diverge, the attacker's too: then
      // no round reaches its quorum and the run ends early, naming the quorum.
      EXPECT_NE(f.server_status.ToString().find("quorum"), std::string::npos) << f.server_status;
    } else {
      EXPECT_TRUE(f.server_status.ok()) << f.server_status;
      EXPECT_EQ(h.size(), 5u);
    }
    if (rule != "mean") {
      for (const auto& m : h) EXPECT_EQ(m.participants, kClients) << "nobody's training diverged";
    }
    if (rule == "clipped" && attacked) {
      // Each round the hostile device's neighbours clip it (and may clip an honest one).
      for (const auto& m : h) EXPECT_GE(m.gossip.value().clipped, 2);
    }
    double sum = 0;
    for (int i = 0; i < kHostile; ++i) {
      auto m = Model::Create({"mlp", "", 1});
      EXPECT_TRUE(m.ok() && (*m)->SetParameters(f.clients[i]->GossipModel()).ok());
      auto e = (*m)->Evaluate(test, 1000);
      sum += e.ok() && std::isfinite(e->loss) ? e->accuracy : 0;
    }
    std::printf("gossip_rule %s%s: honest accuracy %.4f\n", rule.c_str(), attacked ? ", attacked" : "",
                sum / kHostile);
    return sum / kHostile;
  };
  const double clean = honest_accuracy("mean", false);
  EXPECT_GT(clean, 0.75) << "the federation learns";
  EXPECT_LT(honest_accuracy("mean", true), clean - 0.1) << "plain gossip spreads the poison";
  EXPECT_GT(honest_accuracy("clipped", true), clean - 0.02);
  EXPECT_GT(honest_accuracy("trimmed", true), clean - 0.02);
}

}  // namespace
}  // namespace cleave
