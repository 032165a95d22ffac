// The gossip graph (server/modes/topology.h): rings, random rings and rings with the edges
// measured uplinks afford, Metropolis-Hastings weights that make a symmetric, doubly
// stochastic mixing matrix.
#include "server/modes/topology.h"

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


std::vector<std::set<int>> Neighbours(const GossipGraph& g) {
  std::vector<std::set<int>> out;
  for (const auto& ns : g.neighbours) {
    out.emplace_back();
    for (const auto& [j, w] : ns) out.back().insert(j);
  }
  return out;
}

// Node i takes up to min(degree, floor(2 u_i / u_min)) neighbours: the slowest and the
// unmeasured keep their ring's two, and the fastest pairs are joined first.
TEST(TopologyTest, MeasuredUplinksAffordFastNodesMoreNeighbours) {
  std::mt19937_64 rng(1);
  const auto ring = Neighbours(MakeGossipGraph(6, "ring", 4, rng));
  // Node 0 the slowest, node 5 not measured yet, nodes 1-4 ten times faster.
  const GossipGraph g = MakeGossipGraph(6, "measured", 4, rng, {10, 100, 100, 100, 100, 0});
  ExpectMixing(g);
  const auto n = Neighbours(g);
  EXPECT_EQ(n[0], ring[0]);
  EXPECT_EQ(n[5], ring[5]);
  EXPECT_EQ(n[1], (std::set<int>{0, 2, 3, 4}));
  EXPECT_EQ(n[2], (std::set<int>{1, 3, 4}));
  EXPECT_EQ(n[3], (std::set<int>{1, 2, 4}));
  EXPECT_EQ(n[4], (std::set<int>{1, 2, 3, 5}));

  // A binding cap: node 1 (twice the slowest) takes 4 neighbours, and the fastest pairs
  // came first, so the last candidate (1, 5) is left out.
  const auto capped = Neighbours(MakeGossipGraph(6, "measured", 6, rng, {10, 20, 30, 100, 100, 100}));
  EXPECT_EQ(capped[0], (std::set<int>{1, 5}));
  EXPECT_EQ(capped[1], (std::set<int>{0, 2, 3, 4}));
  EXPECT_EQ(capped[2], (std::set<int>{1, 3, 4, 5}));
  EXPECT_EQ(capped[5], (std::set<int>{0, 2, 3, 4}));

  // Equal uplinks (within a factor of 1.5), none measured, or no uplinks given: the ring.
  EXPECT_EQ(Neighbours(MakeGossipGraph(6, "measured", 4, rng, {50, 60, 50, 74, 50, 50})), ring);
  EXPECT_EQ(Neighbours(MakeGossipGraph(6, "measured", 4, rng, std::vector<double>(6, 0))), ring);
  EXPECT_EQ(Neighbours(MakeGossipGraph(6, "measured", 4, rng)), ring);
}

}  // namespace
}  // namespace cleave
