#include "server/topology.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <tuple>

namespace cleave {

namespace {

// The extra edges of a "measured" graph (MakeGossipGraph) onto the ring in `adj`.
void AddAffordableEdges(const std::vector<double>& uplink, int degree,
                        std::vector<std::set<int>>* adj) {
  const int n = static_cast<int>(adj->size());
  double slowest = 0;
  for (double u : uplink) {
    if (u > 0 && (slowest == 0 || u < slowest)) slowest = u;
  }
  if (slowest == 0) return;
  std::vector<size_t> cap(n, 2);
  for (int i = 0; i < n; ++i) {
    if (uplink[i] > 0) {
      cap[i] = static_cast<size_t>(std::min<double>(degree, std::floor(2 * uplink[i] / slowest)));
    }
  }
  std::vector<std::tuple<double, int, int>> pairs;  // (-slower end's uplink, i, j)
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (cap[i] > 2 && cap[j] > 2 && !(*adj)[i].count(j)) {
        pairs.emplace_back(-std::min(uplink[i], uplink[j]), i, j);
      }
    }
  }
  std::sort(pairs.begin(), pairs.end());
  for (const auto& [speed, i, j] : pairs) {
    if ((*adj)[i].size() < cap[i] && (*adj)[j].size() < cap[j]) {
      (*adj)[i].insert(j);
      (*adj)[j].insert(i);
    }
  }
}

}  // namespace

GossipGraph MakeGossipGraph(int n, const std::string& topology, int degree, std::mt19937_64& rng,
                            const std::vector<double>& uplink_mbps) {
  std::vector<std::set<int>> adj(n);
  auto ring = [&](const std::vector<int>& order) {
    for (int k = 0; k < n && n > 1; ++k) {
      const int a = order[k], b = order[(k + 1) % n];
      if (a != b) {
        adj[a].insert(b);
        adj[b].insert(a);
      }
    }
  };
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (topology == "random") {
    for (int r = 0; r < degree / 2; ++r) {
      std::shuffle(order.begin(), order.end(), rng);
      ring(order);
    }
  } else {
    ring(order);
    if (topology == "measured" && static_cast<int>(uplink_mbps.size()) == n) {
      AddAffordableEdges(uplink_mbps, degree, &adj);
    }
  }
  GossipGraph g;
  g.neighbours.resize(n);
  g.self_weight.assign(n, 1.0);
  for (int i = 0; i < n; ++i) {
    for (int j : adj[i]) {
      const double w = 1.0 / (1.0 + static_cast<double>(std::max(adj[i].size(), adj[j].size())));
      g.neighbours[i].emplace_back(j, w);
      g.self_weight[i] -= w;
    }
  }
  return g;
}

}  // namespace cleave
