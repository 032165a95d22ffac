#include "server/modes/topology.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

namespace cleave {

namespace {

// The extra edges of a "measured" graph (MakeGossipGraph) onto the ring in `adj`: the
// pairs by their slower end's uplink, fastest first. Nodes are taken fastest first, each
// joined to the faster ones still open (with room) before it; a node leaves the open list
// once full, so a round costs O(n log n + n degree), not a sort of all n^2 pairs.
void AddAffordableEdges(const std::vector<double>& uplink, int degree,
                        std::vector<std::set<int>>* adj) {
  const int n = static_cast<int>(adj->size());
  double slowest = 0;
  for (double u : uplink) {
    if (u > 0 && (slowest == 0 || u < slowest)) slowest = u;
  }
  if (slowest == 0) return;
  std::vector<size_t> cap(n, 2);
  std::vector<int> order;  // nodes that may take more than their ring's two
  for (int i = 0; i < n; ++i) {
    if (uplink[i] > 0) {
      cap[i] = static_cast<size_t>(std::min<double>(degree, std::floor(2 * uplink[i] / slowest)));
    }
    if (cap[i] > 2) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return uplink[a] > uplink[b]; });
  auto& g = *adj;
  std::vector<int> open;
  for (int p : order) {
    for (size_t k = 0; k < open.size() && g[p].size() < cap[p]; ++k) {
      const int q = open[k];
      if (g[q].size() < cap[q] && !g[p].count(q)) {
        g[p].insert(q);
        g[q].insert(p);
      }
    }
    open.erase(std::remove_if(open.begin(), open.end(), [&](int q) { return g[q].size() >= cap[q]; }),
               open.end());
    if (g[p].size() < cap[p]) open.push_back(p);
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
