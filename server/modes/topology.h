// The graph of a decentralised round (scheduler.mode: gossip): who averages with whom,
// and with what weights. No gRPC, no LibTorch.
#pragma once

#include <random>
#include <string>
#include <utility>
#include <vector>

namespace cleave {

struct GossipGraph {
  // neighbours[i]: (j, w_ij) for each neighbour j of node i, j ascending.
  std::vector<std::vector<std::pair<int, double>>> neighbours;
  std::vector<double> self_weight;  // w_ii = 1 - sum_j w_ij
};

// An undirected graph over n nodes (0..n-1, the round's clients in name order):
//  - "ring": i with i-1 and i+1 (mod n); two nodes are one edge, one node none;
//  - "random": the union of degree / 2 rings, each over a random permutation drawn from
//    `rng` (a new graph each round: every node has at most `degree` neighbours, and the
//    graph is connected, since each ring alone is);
//  - "measured": the ring, plus edges that cost the round no time by the nodes' measured
//    uplinks `uplink_mbps` (0: not measured). A node sends its model to each neighbour
//    over its one uplink, and the round waits for the slowest node's two ring sends: a
//    node i with uplink u_i takes up to min(degree, floor(2 u_i / u_min)) neighbours
//    (u_min: the slowest measured uplink), so faster nodes mix more in that time while
//    the slowest and the unmeasured keep their two. Extra edges join the fastest pairs
//    first (by the slower end's uplink, then by index).
// Weights are Metropolis-Hastings: w_ij = 1 / (1 + max(d_i, d_j)) for an edge, so the
// mixing matrix is symmetric and doubly stochastic and repeated averaging converges to
// the mean of the nodes' models.
GossipGraph MakeGossipGraph(int n, const std::string& topology, int degree, std::mt19937_64& rng,
                            const std::vector<double>& uplink_mbps = {});

}  // namespace cleave
