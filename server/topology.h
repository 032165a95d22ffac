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
//    graph is connected, since each ring alone is).
// Weights are Metropolis-Hastings: w_ij = 1 / (1 + max(d_i, d_j)) for an edge, so the
// mixing matrix is symmetric and doubly stochastic and repeated averaging converges to
// the mean of the nodes' models.
GossipGraph MakeGossipGraph(int n, const std::string& topology, int degree, std::mt19937_64& rng);

}  // namespace cleave
