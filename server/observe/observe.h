// What an operator sees of a running server (server.metrics_listen): a snapshot of the
// run taken under the coordinator's lock (Coordinator::Observe), rendered as Prometheus'
// text exposition format (/metrics) and as JSON for the dashboard (/api/state); the
// dashboard page itself (/) is DashboardHtml(). No gRPC, no HTTP: the endpoint that
// serves them is server/observe/observe_http.h.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/memory.h"  // ResidentBytes
#include "server/server.h"

namespace cleave {

// Latencies as a Prometheus histogram: fixed buckets, counted without a lock.
class LatencyHistogram {
 public:
  // Upper bounds in seconds; one more bucket (+Inf) counts the rest.
  static constexpr std::array<double, 12> kBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                     0.5,   1,    2.5,   5,    10,  30};
  void Observe(double seconds);
  struct Snapshot {
    std::array<int64_t, kBounds.size() + 1> counts{};  // per bucket, not cumulative
    double sum_s = 0;
    int64_t count = 0;
  };
  Snapshot Get() const;

 private:
  std::array<std::atomic<int64_t>, kBounds.size() + 1> counts_{};
  std::atomic<int64_t> sum_us_{0};
};

// One connected client as the operator sees it.
struct ClientHealth {
  std::string name;
  std::string id;
  // "idle", "training" (a task in flight), "adding" (its upload) or "unfit" (it cannot
  // hold the model, or no width rate fits it: no tasks until it joins again)
  std::string state;
  double last_seen_s = 0;     // since its last message
  double task_s = 0;          // its last accepted task's training time (0: none yet)
  double step_s = 0;          // split learning: its last task's mean step time
  double uplink_mbps = 0;     // measured (split learning, cut: auto); 0 = unknown
  double downlink_mbps = 0;
  int cut = 0;                // split learning: its last cut; 0 = none
  int64_t done = 0;           // tasks accepted
  int64_t failures = 0;       // tasks failed
};

struct ObservedState {
  std::string run_id;
  std::string phase;
  int64_t committed_round = 0;
  int64_t current_round = 0;  // 0 between rounds
  int64_t total_rounds = 0;
  std::vector<RoundMetrics> history;  // every round's metrics (only when asked for)
  std::optional<RoundMetrics> last_round;  // the last trained round's
  int64_t task_failures = 0;              // over the run's rounds
  int64_t bytes_up = 0, bytes_down = 0;  // the run's transport bytes
  int uploads_in_progress = 0, uploads_queued = 0;
  int64_t rss_bytes = 0;
  LatencyHistogram::Snapshot upload_s, fetch_s;
  std::vector<ClientHealth> clients;  // every connected client, by name
  std::string config_yaml;            // the job as given
};

// Prometheus' text format (version 0.0.4). Per-client series are limited to
// `client_series` clients: those with the most failed tasks first, then by name; the
// others count only in the totals (docs/configuration.md, server.metrics_client_series).
std::string PrometheusText(const ObservedState& s, int client_series);

// The dashboard's view: the run, its rounds, its clients, its configuration.
std::string StateJson(const ObservedState& s);

// The dashboard page: self-contained (inline script and styles, nothing fetched but
// /api/state), drawn from `initial_state` (StateJson) at once, then polled every second.
std::string DashboardHtml(const std::string& initial_state);

}  // namespace cleave
