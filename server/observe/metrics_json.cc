#include "server/observe/metrics_json.h"

#include <algorithm>
#include <cmath>

namespace cleave {

namespace {

// Split learning's figures, with each pipeline chain's schedule.
void AddSplit(const SplitMetrics& s, nlohmann::json& j) {
  j["activation_bytes_up"] = s.activation_bytes_up;
  j["gradient_bytes_down"] = s.gradient_bytes_down;
  j["labels_up"] = s.labels_up;
  j["cuts"] = s.cuts;
  j["step_s"] = s.step_s;
  j["client_compute_s"] = s.client_compute_s;
  j["transfer_s"] = s.transfer_s;
  j["server_compute_s"] = s.server_compute_s;
  j["server_busy"] = s.server_busy;
  if (!s.chains.empty()) {
    auto& chains = j["pipeline"] = nlohmann::json::array();
    for (const SplitMetrics::Chain& c : s.chains) {
      auto spans = nlohmann::json::array();
      for (const auto& x : c.spans) {
        spans.push_back({x.device, x.micro_batch, x.forward ? "F" : "B", x.start_s, x.end_s});
      }
      chains.push_back({{"devices", c.devices}, {"bounds", c.bounds}, {"done", c.done},
                        {"busy", c.busy}, {"bubble", c.bubble}, {"spans", std::move(spans)}});
    }
  }
}

// An asynchronous buffer's version and the staleness of its updates.
void AddAsync(const AsyncMetrics& a, const RoundMetrics& m, nlohmann::json& j) {
  j["version"] = m.round;
  auto& st = j["staleness"] = nlohmann::json::object();
  double sum = 0;
  int64_t most = 0;
  for (const auto& [s, n] : a.staleness) {
    st[std::to_string(s)] = n;
    sum += static_cast<double>(s) * n;
    most = std::max(most, s);
  }
  j["staleness_mean"] = m.participants ? sum / m.participants : 0.0;
  j["staleness_max"] = most;
  j["local_steps"] = {{"mean", a.local_steps_mean}, {"min", a.local_steps_min},
                      {"max", a.local_steps_max}};
}

}  // namespace

nlohmann::json RoundMetricsJson(const RoundMetrics& m) {
  nlohmann::json j = {{"round", m.round},
                      {"train_loss", m.train_loss},
                      {"participants", m.participants},
                      {"examples", m.examples},
                      {"failures", m.failures},
                      {"bytes_up", m.bytes_up},
                      {"bytes_down", m.bytes_down},
                      {"bytes_up_fp32", m.bytes_up_fp32},
                      {"update_bytes", m.update_bytes},
                      {"bytes_down_fp32", m.bytes_down_fp32},
                      {"compression_up", m.bytes_up ? double(m.bytes_up_fp32) / m.bytes_up : 1.0},
                      {"compression_down",
                       m.bytes_down ? double(m.bytes_down_fp32) / m.bytes_down : 1.0},
                      {"wall_s", m.wall_s},
                      {"elapsed_s", m.elapsed_s}};
  if (m.evaluation_only) {
    j.erase("train_loss");
    j.erase("examples");
    j["evaluation_only"] = true;
  }
  if (m.evaluated) {
    j["test_accuracy"] = m.test_accuracy;
    j["test_loss"] = m.test_loss;
    for (const auto& [k, v] : m.test_metrics) j["test_" + k] = v;
    if (!m.test_per_class_accuracy.empty()) {
      auto& per_class = j["test_per_class_accuracy"] = nlohmann::json::array();
      for (double a : m.test_per_class_accuracy) {
        per_class.push_back(std::isnan(a) ? nlohmann::json(nullptr) : nlohmann::json(a));
      }
    }
  }
  if (m.split) AddSplit(*m.split, j);
  if (!m.widths.empty()) j["widths"] = m.widths;
  if (const GossipMetrics* g = m.gossip ? &*m.gossip : nullptr) {
    j["gossip"] = {{"disagreement", g->disagreement}, {"peer_bytes", g->peer_bytes},
                   {"neighbours", g->neighbours}, {"heard", g->heard}, {"clipped", g->clipped}};
  }
  if (m.client_eval.clients > 0) {
    const auto& e = m.client_eval;
    j["client_eval"] = {{"clients", e.clients},           {"examples", e.examples},
                        {"accuracy", e.accuracy},         {"loss", e.loss},
                        {"accuracy_min", e.accuracy_min}, {"accuracy_median", e.accuracy_median},
                        {"accuracy_max", e.accuracy_max}, {"loss_min", e.loss_min},
                        {"loss_median", e.loss_median}, {"loss_max", e.loss_max},
                        {"seconds", e.seconds},
                        {"train_seconds", e.train_seconds}};
    for (const auto& [k, v] : e.metrics) j["client_eval"][k] = v;
    if (m.evaluation_only) j["client_eval"].erase("train_seconds");  // nothing trained
  }
  if (m.async) AddAsync(*m.async, m, j);
  if (m.update_noise) j["update_noise"] = {{"noise", m.update_noise->noise}, {"signal", m.update_noise->signal}};
  for (const auto& [k, v] : m.strategy_stats) j[k] = v;
  return j;
}

}  // namespace cleave
