// Label differential privacy by randomized response (Warner 1965; Ghazi et al. 2021,
// "Deep learning with label differential privacy", its RR baseline): split.label_epsilon.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace cleave {

// The probability that epsilon-randomized response over `classes` keeps a label:
// e^eps / (e^eps + classes - 1).
double KeepProbability(double epsilon, int64_t classes);

// Replaces each label in [0, classes) of `labels` with probability 1 - KeepProbability
// by one of the classes - 1 others, uniformly: each output is epsilon-DP in its label.
// Others (kNoTarget, a language model's positions without a target) stay as they are.
void RandomizeLabels(double epsilon, int64_t classes, std::mt19937_64& rng, std::vector<int64_t>* labels);

}  // namespace cleave
