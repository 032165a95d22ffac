#include "server/topology.h"

#include <algorithm>
#include <numeric>
#include <set>

namespace cleave {

GossipGraph MakeGossipGraph(int n, const std::string& topology, int degree, std::mt19937_64& rng) {
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
