#include "privacy/label_dp.h"

#include <cmath>

namespace cleave {

double KeepProbability(double epsilon, int64_t classes) {
  // 1 / (1 + (K - 1) e^-eps): no overflow for a large epsilon
  return 1 / (1 + static_cast<double>(classes - 1) * std::exp(-epsilon));
}

void RandomizeLabels(double epsilon, int64_t classes, std::mt19937_64& rng, std::vector<int64_t>* labels) {
  if (classes < 2) return;
  std::bernoulli_distribution keep(KeepProbability(epsilon, classes));
  std::uniform_int_distribution<int64_t> other(0, classes - 2);
  for (int64_t& y : *labels) {
    if (y < 0 || y >= classes || keep(rng)) continue;
    const int64_t z = other(rng);
    y = z >= y ? z + 1 : z;  // the K - 1 classes but y
  }
}

}  // namespace cleave
