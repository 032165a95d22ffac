#include "aggregation/gossip_mix.h"

#include <algorithm>
#include <cmath>

namespace cleave {

const NameTable& GossipRuleNames() {
  static const NameTable t{"scheduler.gossip_rule", {"mean", "clipped", "trimmed"}};
  return t;
}

namespace {

double SquaredDistance(const ParameterSet& a, const ParameterSet& b) {
  double d2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& x = a.tensors()[i].values;
    const auto& y = b.tensors()[i].values;
    for (size_t j = 0; j < x.size(); ++j) {
      const double d = static_cast<double>(x[j]) - y[j];
      d2 += d * d;
    }
  }
  return d2;
}

// x_i + sum_j w_j s_j (x_j - x_i), with s_j = 1 (mean) or the clipping factor.
ParameterSet MoveTowards(const ParameterSet& self, const std::vector<HeardModel>& heard,
                         const std::vector<double>& scale) {
  ParameterSet out = self;
  for (size_t i = 0; i < out.size(); ++i) {
    auto& x = out.mutable_tensors()[i].values;
    const auto& mine = self.tensors()[i].values;
    for (size_t k = 0; k < heard.size(); ++k) {
      const double w = heard[k].weight * scale[k];
      const auto& y = heard[k].model->tensors()[i].values;
      for (size_t j = 0; j < x.size(); ++j) x[j] += static_cast<float>(w * (y[j] - mine[j]));
    }
  }
  return out;
}

ParameterSet TrimmedMean(const ParameterSet& self, const std::vector<HeardModel>& heard,
                         double byzantine) {
  const size_t n = heard.size() + 1;
  // At most (n - 1) / 2 from each end: a median is left at worst.
  const size_t drop = std::min((n - 1) / 2, static_cast<size_t>(std::floor(byzantine * static_cast<double>(heard.size()))));
  ParameterSet out = self;
  std::vector<float> v(n);
  for (size_t i = 0; i < out.size(); ++i) {
    auto& x = out.mutable_tensors()[i].values;
    for (size_t j = 0; j < x.size(); ++j) {
      v[0] = self.tensors()[i].values[j];
      for (size_t k = 0; k < heard.size(); ++k) v[k + 1] = heard[k].model->tensors()[i].values[j];
      std::sort(v.begin(), v.end());
      double sum = 0;
      for (size_t k = drop; k < n - drop; ++k) sum += v[k];
      x[j] = static_cast<float>(sum / static_cast<double>(n - 2 * drop));
    }
  }
  return out;
}

}  // namespace

ParameterSet MixGossip(const GossipRule& rule, const ParameterSet& self,
                       const std::vector<HeardModel>& heard, GossipMixStats* stats) {
  std::vector<double> distance;
  for (const HeardModel& h : heard) {
    const double d2 = SquaredDistance(self, *h.model);
    stats->disagreement += d2;
    distance.push_back(std::sqrt(d2));
  }
  if (rule.name == "trimmed") return TrimmedMean(self, heard, rule.byzantine);
  std::vector<double> scale(heard.size(), 1.0);
  if (rule.name == "clipped" && !heard.empty()) {
    // tau: the smallest distance beyond which at most `byzantine` of the weight lies.
    std::vector<size_t> order(heard.size());
    for (size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return distance[a] < distance[b]; });
    double total = 0;
    for (const HeardModel& h : heard) total += h.weight;
    double beyond = total;
    for (size_t k : order) {
      beyond -= heard[k].weight;
      stats->radius = distance[k];
      if (beyond <= rule.byzantine * total * (1 + 1e-12)) break;
    }
    for (size_t k = 0; k < heard.size(); ++k) {
      if (distance[k] > stats->radius) {
        scale[k] = stats->radius / distance[k];
        ++stats->clipped;
      }
    }
  }
  return MoveTowards(self, heard, scale);
}

}  // namespace cleave
