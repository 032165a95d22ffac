// The gossip graph (server/topology.h): rings and random rings, Metropolis-Hastings
// weights that make a symmetric, doubly stochastic mixing matrix.
#include "server/topology.h"

#include <gtest/gtest.h>

#include <queue>
#include <set>

namespace cleave {
namespace {

// Checks what every graph must be: symmetric weights, rows that sum to 1 with a
// non-negative self weight, no self-loops, and connected.
void ExpectMixing(const GossipGraph& g) {
  const int n = static_cast<int>(g.neighbours.size());
  std::vector<std::vector<double>> w(n, std::vector<double>(n, 0));
  for (int i = 0; i < n; ++i) {
    double row = g.self_weight[i];
    EXPECT_GE(g.self_weight[i], -1e-12) << i;
    for (const auto& [j, wij] : g.neighbours[i]) {
      EXPECT_NE(i, j);
      EXPECT_GT(wij, 0);
      w[i][j] = wij;
      row += wij;
    }
    EXPECT_NEAR(row, 1.0, 1e-12) << i;
  }
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) EXPECT_DOUBLE_EQ(w[i][j], w[j][i]) << i << "," << j;
  }
  std::vector<bool> seen(n, false);
  std::queue<int> q;
  if (n > 0) {
    q.push(0);
    seen[0] = true;
  }
  while (!q.empty()) {
    const int i = q.front();
    q.pop();
    for (const auto& [j, wij] : g.neighbours[i]) {
      if (!seen[j]) {
        seen[j] = true;
        q.push(j);
      }
    }
  }
  for (int i = 0; i < n; ++i) EXPECT_TRUE(seen[i]) << "node " << i << " is not reached";
}

TEST(TopologyTest, RingsAverageWithBothSides) {
  std::mt19937_64 rng(1);
  const GossipGraph g = MakeGossipGraph(5, "ring", 4, rng);
  ExpectMixing(g);
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(g.neighbours[i].size(), 2u);
    std::set<int> ns = {g.neighbours[i][0].first, g.neighbours[i][1].first};
    EXPECT_EQ(ns, (std::set<int>{(i + 4) % 5, (i + 1) % 5}));
    EXPECT_DOUBLE_EQ(g.neighbours[i][0].second, 1.0 / 3);
    EXPECT_DOUBLE_EQ(g.self_weight[i], 1.0 / 3);
  }
  const GossipGraph two = MakeGossipGraph(2, "ring", 4, rng);
  ExpectMixing(two);
  ASSERT_EQ(two.neighbours[0].size(), 1u);
  EXPECT_DOUBLE_EQ(two.neighbours[0][0].second, 0.5);
  const GossipGraph one = MakeGossipGraph(1, "ring", 4, rng);
  EXPECT_TRUE(one.neighbours[0].empty());
  EXPECT_DOUBLE_EQ(one.self_weight[0], 1.0);
}

TEST(TopologyTest, RandomGraphsAreBoundedConnectedAndSeeded) {
  std::mt19937_64 a(7), b(7);
  std::set<std::vector<int>> distinct;
  for (int round = 0; round < 5; ++round) {
    const GossipGraph g = MakeGossipGraph(12, "random", 4, a);
    const GossipGraph h = MakeGossipGraph(12, "random", 4, b);
    ExpectMixing(g);
    std::vector<int> edges;
    for (int i = 0; i < 12; ++i) {
      EXPECT_GE(g.neighbours[i].size(), 2u);
      EXPECT_LE(g.neighbours[i].size(), 4u);
      ASSERT_EQ(g.neighbours[i].size(), h.neighbours[i].size()) << "the same seed, the same graph";
      for (size_t k = 0; k < g.neighbours[i].size(); ++k) {
        EXPECT_EQ(g.neighbours[i][k], h.neighbours[i][k]);
        edges.push_back(i * 100 + g.neighbours[i][k].first);
      }
    }
    distinct.insert(edges);
  }
  EXPECT_GT(distinct.size(), 1u) << "a new graph each round";
}

}  // namespace
}  // namespace cleave
