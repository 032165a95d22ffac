// How a gossip client combines its model with its neighbours' (scheduler.gossip_rule).
//
//   mean     x_i <- w_ii x_i + sum_j w_ij x_j (Metropolis-Hastings weights; a neighbour not
//            heard from leaves its weight with x_i). One hostile neighbour moves x_i by
//            w_ij times whatever it sends, every round.
//   clipped  self-centred clipping (He, Karimireddy and Jaggi 2022, "Byzantine-robust
//            decentralized learning via ClippedGossip"): x_i <- x_i + sum_j w_ij
//            clip(x_j - x_i, tau_i), clip(z, tau) = z min(1, tau / ||z||). tau_i is the
//            paper's adaptive radius: the smallest neighbour distance ||x_j - x_i|| such
//            that the neighbours farther than it carry at most `byzantine` of the
//            neighbours' weight. A hostile neighbour then moves x_i by at most w_ij tau_i,
//            and tau_i is set by the honest ones.
//   trimmed  coordinate-wise trimmed mean over x_i and the neighbours heard from: the
//            floor(byzantine x heard) largest and smallest values of each coordinate
//            dropped (at most down to the median), the rest averaged with equal weights.
#pragma once

#include <string>
#include <vector>

#include "core/names.h"
#include "core/parameter_set.h"

namespace cleave {

const NameTable& GossipRuleNames();  // scheduler.gossip_rule: mean | clipped | trimmed

struct GossipRule {
  std::string name = "mean";
  double byzantine = 0.5;  // scheduler.gossip_byzantine, in [0, 1)
};

struct HeardModel {
  double weight;               // w_ij
  const ParameterSet* model;   // x_j, of self's layout
};

struct GossipMixStats {
  double disagreement = 0;  // sum over the heard of ||x_i - x_j||^2
  int clipped = 0;          // clipped: neighbours whose difference was shortened
  double radius = 0;        // clipped: tau_i
};

// The mixed model, from self's and those of the neighbours heard from. With weights
// that sum to one (w_ii = 1 - sum_j w_ij), mean is x_i + sum_j w_ij (x_j - x_i): what a
// neighbour not heard from would have moved stays with x_i.
ParameterSet MixGossip(const GossipRule& rule, const ParameterSet& self,
                       const std::vector<HeardModel>& heard, GossipMixStats* stats);

}  // namespace cleave
