// The default federated evaluation summary (Strategy::AggregateEvaluation).
#include <algorithm>

#include "aggregation/strategy.h"

namespace cleave {

EvaluationSummary SummariseEvaluations(const std::vector<ClientEvaluationResult>& results) {
  EvaluationSummary e;
  if (results.empty()) return e;
  std::vector<double> accuracies, losses;
  std::map<std::string, int64_t> metric_examples;  // a client may omit a metric
  for (const ClientEvaluationResult& r : results) {
    ++e.clients;
    e.examples += r.examples;
    e.accuracy += r.accuracy * r.examples;
    e.loss += r.loss * r.examples;
    e.seconds += r.seconds;
    e.train_seconds += r.train_seconds;
    accuracies.push_back(r.accuracy);
    losses.push_back(r.loss);
    for (const auto& [k, v] : r.metrics) {
      e.metrics[k] += v * r.examples;
      metric_examples[k] += r.examples;
    }
  }
  if (e.examples > 0) {
    e.accuracy /= e.examples;
    e.loss /= e.examples;
  }
  for (auto& [k, v] : e.metrics) v /= metric_examples[k];
  // Clients name their own metrics: the round keeps the kMaxSummaryMetrics that the most
  // examples measured (ties by name), however many names its clients sent.
  if (e.metrics.size() > kMaxSummaryMetrics) {
    std::vector<std::pair<int64_t, std::string>> by_examples;
    for (const auto& [k, n] : metric_examples) by_examples.emplace_back(-n, k);
    std::sort(by_examples.begin(), by_examples.end());
    for (size_t i = kMaxSummaryMetrics; i < by_examples.size(); ++i) e.metrics.erase(by_examples[i].second);
  }
  e.seconds /= e.clients;
  e.train_seconds /= e.clients;
  auto spread = [](std::vector<double> v, double* min, double* median, double* max) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    *min = v.front();
    *max = v.back();
    *median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  spread(accuracies, &e.accuracy_min, &e.accuracy_median, &e.accuracy_max);
  spread(losses, &e.loss_min, &e.loss_median, &e.loss_max);
  return e;
}

}  // namespace cleave
