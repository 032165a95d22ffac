#include "server/observe/observe.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "core/prometheus.h"
#include "server/observe/metrics_json.h"

namespace cleave {

void LatencyHistogram::Observe(double seconds) {
  if (!(seconds >= 0)) return;
  size_t b = 0;
  while (b < kBounds.size() && seconds > kBounds[b]) ++b;
  counts_[b].fetch_add(1, std::memory_order_relaxed);
  sum_us_.fetch_add(static_cast<int64_t>(seconds * 1e6), std::memory_order_relaxed);
}

LatencyHistogram::Snapshot LatencyHistogram::Get() const {
  Snapshot s;
  for (size_t b = 0; b < counts_.size(); ++b) {
    s.counts[b] = counts_[b].load(std::memory_order_relaxed);
    s.count += s.counts[b];
  }
  s.sum_s = static_cast<double>(sum_us_.load(std::memory_order_relaxed)) / 1e6;
  return s;
}

namespace {

using prometheus::Exposition;
using prometheus::Label;
using prometheus::Num;

void Histogram(Exposition& e, const std::string& name, const char* help,
               const LatencyHistogram::Snapshot& h) {
  e.Family(name, "histogram", help);
  int64_t cumulative = 0;
  for (size_t b = 0; b < LatencyHistogram::kBounds.size(); ++b) {
    cumulative += h.counts[b];
    e.Sample(name + "_bucket", static_cast<double>(cumulative),
             "le=\"" + Num(LatencyHistogram::kBounds[b]) + "\"");
  }
  e.Sample(name + "_bucket", static_cast<double>(h.count), "le=\"+Inf\"");
  e.Sample(name + "_sum", h.sum_s);
  e.Sample(name + "_count", static_cast<double>(h.count));
}

// The run's series: its round, the last round's results, traffic, uploads, memory.
void RunSeries(const ObservedState& s, Exposition& e) {
  e.Family("cleave_info", "gauge", "The run this server coordinates.");
  e.Sample("cleave_info", 1, "run_id=\"" + Label(s.run_id) + "\",phase=\"" + Label(s.phase) + "\"");
  e.Gauge("cleave_round", "The last committed round (model version).",
          static_cast<double>(s.committed_round));
  e.Gauge("cleave_round_in_progress", "The round being run; 0 between rounds.",
          static_cast<double>(s.current_round));
  e.Gauge("cleave_rounds", "The rounds the run is to make (run.rounds).",
          static_cast<double>(s.total_rounds));
  if (const RoundMetrics* last = s.last_round ? &*s.last_round : nullptr) {
    if (last->evaluated) {
      e.Gauge("cleave_test_accuracy", "The last committed model's accuracy on data.test.",
              last->test_accuracy);
      e.Gauge("cleave_test_loss", "The last committed model's loss on data.test.",
              last->test_loss);
    }
    if (last->client_eval.clients > 0) {
      e.Gauge("cleave_client_eval_accuracy",
              "The clients' accuracy on their held-out data in the last round.",
              last->client_eval.accuracy);
    }
    e.Gauge("cleave_train_loss", "The last round's mean training loss.", last->train_loss);
    e.Gauge("cleave_participants", "Results accepted in the last round.", last->participants);
    e.Gauge("cleave_round_failures", "Tasks failed in the last round.", last->failures);
    e.Gauge("cleave_round_seconds", "The last round's wall time.", last->wall_s);
  }
  e.Counter("cleave_task_failures_total", "Tasks failed over the run's rounds.",
            static_cast<double>(s.task_failures));
  e.Counter("cleave_bytes_up_total", "Bytes received over the transport.",
            static_cast<double>(s.bytes_up));
  e.Counter("cleave_bytes_down_total", "Bytes sent over the transport.",
            static_cast<double>(s.bytes_down));
  e.Gauge("cleave_connected_clients", "Clients with a session.",
          static_cast<double>(s.clients.size()));
  e.Gauge("cleave_uploads_in_progress", "Uploads holding or waiting for a slot.",
          s.uploads_in_progress);
  e.Gauge("cleave_uploads_queued", "Uploads waiting for a slot (server.worker_threads).",
          s.uploads_queued);
  e.Gauge("cleave_resident_memory_bytes", "The server's resident memory.",
          static_cast<double>(s.rss_bytes));
  Histogram(e, "cleave_upload_seconds", "Accepted uploads, from their first message to accepted.",
              s.upload_s);
  Histogram(e, "cleave_fetch_seconds", "Completed model downloads.", s.fetch_s);
}

// Per-client series, bounded: the clients with the most failures, then by name.
void ClientSeries(const ObservedState& s, int client_series, Exposition& e) {
  std::vector<const ClientHealth*> shown;
  for (const auto& c : s.clients) shown.push_back(&c);
  std::sort(shown.begin(), shown.end(), [](const ClientHealth* a, const ClientHealth* b) {
    return a->failures != b->failures ? a->failures > b->failures : a->name < b->name;
  });
  const size_t n = std::min(shown.size(), static_cast<size_t>(std::max(0, client_series)));
  e.Gauge("cleave_client_series_dropped",
          "Connected clients without per-client series (server.metrics_client_series).",
          static_cast<double>(shown.size() - n));
  struct PerClient {
    const char* name;
    const char* type;
    const char* help;
    double (*get)(const ClientHealth&);
  };
  const PerClient per_client[] = {
      {"cleave_client_last_seen_seconds", "gauge", "Seconds since the client's last message.",
       [](const ClientHealth& c) { return c.last_seen_s; }},
      {"cleave_client_training", "gauge", "1 while the client has a task in flight.",
       [](const ClientHealth& c) { return c.state == "training" || c.state == "adding" ? 1.0 : 0.0; }},
      {"cleave_client_task_seconds", "gauge", "The client's last task's training time.",
       [](const ClientHealth& c) { return c.task_s; }},
      {"cleave_client_step_seconds", "gauge", "Split learning: the client's mean step time.",
       [](const ClientHealth& c) { return c.step_s; }},
      {"cleave_client_uplink_mbps", "gauge", "The client's measured uplink (0: unknown).",
       [](const ClientHealth& c) { return c.uplink_mbps; }},
      {"cleave_client_downlink_mbps", "gauge", "The client's measured downlink (0: unknown).",
       [](const ClientHealth& c) { return c.downlink_mbps; }},
      {"cleave_client_cut", "gauge", "Split learning: the client's cut (0: none).",
       [](const ClientHealth& c) { return static_cast<double>(c.cut); }},
      {"cleave_client_tasks_done_total", "counter", "Tasks the client completed.",
       [](const ClientHealth& c) { return static_cast<double>(c.done); }},
      {"cleave_client_task_failures_total", "counter", "Tasks the client failed.",
       [](const ClientHealth& c) { return static_cast<double>(c.failures); }},
  };
  for (const PerClient& p : per_client) {
    e.Family(p.name, p.type, p.help);
    for (size_t i = 0; i < n; ++i) {
      e.Sample(p.name, p.get(*shown[i]), "client=\"" + Label(shown[i]->name) + "\"");
    }
  }
}

}  // namespace

std::string PrometheusText(const ObservedState& s, int client_series) {
  Exposition e;
  RunSeries(s, e);
  ClientSeries(s, client_series, e);
  return e.Take();
}

std::string StateJson(const ObservedState& s) {
  nlohmann::json j;
  j["run_id"] = s.run_id;
  j["phase"] = s.phase;
  j["round"] = s.committed_round;
  j["round_in_progress"] = s.current_round;
  j["rounds"] = s.total_rounds;
  j["bytes_up"] = s.bytes_up;
  j["bytes_down"] = s.bytes_down;
  j["rss_bytes"] = s.rss_bytes;
  j["uploads_in_progress"] = s.uploads_in_progress;
  j["uploads_queued"] = s.uploads_queued;
  j["history"] = nlohmann::json::array();
  for (const auto& m : s.history) j["history"].push_back(RoundMetricsJson(m));
  j["clients"] = nlohmann::json::array();
  for (const auto& c : s.clients) {
    j["clients"].push_back({{"name", c.name},
                            {"id", c.id},
                            {"state", c.state},
                            {"last_seen_s", c.last_seen_s},
                            {"task_s", c.task_s},
                            {"step_s", c.step_s},
                            {"uplink_mbps", c.uplink_mbps},
                            {"downlink_mbps", c.downlink_mbps},
                            {"cut", c.cut},
                            {"done", c.done},
                            {"failures", c.failures}});
  }
  j["config"] = s.config_yaml;
  // Replaces invalid UTF-8 instead of throwing: names and the config are the user's.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The dashboard page around its initial state (a JSON object the script renders, then
// refreshes from /api/state every second).
constexpr char kDashboardHead[] = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>cleave dashboard</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .3em; }
.meta span { margin-right: 1.5em; }
.charts { display: flex; flex-wrap: wrap; gap: 1em; margin: 1em 0; }
figure { margin: 0; border: 1px solid #ddd; padding: .5em; }
figcaption { font-weight: 600; font-size: .9em; }
table { border-collapse: collapse; margin: 1em 0; }
td, th { border-bottom: 1px solid #eee; padding: .2em .6em; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.failing { color: #b00; }
pre { background: #f6f6f6; padding: .6em; max-height: 20em; overflow: auto; }
</style></head>
<body>
<h1>cleave <span id="run"></span></h1>
<div class="meta"><span id="phase"></span><span id="progress"></span><span id="clients-count"></span><span id="bytes"></span><span id="memory"></span></div>
<div class="charts" id="charts"></div>
<h2>Clients</h2>
<table id="clients"><thead><tr><th>client</th><th>state</th><th>last seen</th><th>task s</th><th>step ms</th><th>cut</th><th>up Mbps</th><th>down Mbps</th><th>done</th><th>failed</th></tr></thead><tbody></tbody></table>
<h2>Configuration</h2>
<pre id="config"></pre>
<script>
const INITIAL = )HTML";
constexpr char kDashboardTail[] = R"HTML(;
function text(id, s) { document.getElementById(id).textContent = s; }
function mb(b) { return (b / 1e6).toFixed(1) + " MB"; }
function chart(title, rows, series) {
  const W = 320, H = 170, P = 30;
  const pts = series.map(s => rows.filter(r => r[s.key] !== undefined).map(r => [r.round, r[s.key]]));
  const all = pts.flat();
  const fig = document.createElement("figure");
  const cap = document.createElement("figcaption");
  cap.textContent = title;
  fig.appendChild(cap);
  if (all.length === 0) { fig.appendChild(document.createTextNode("no data yet")); return fig; }
  const x0 = Math.min(...all.map(p => p[0])), x1 = Math.max(...all.map(p => p[0]), x0 + 1);
  const y0 = Math.min(0, ...all.map(p => p[1])), y1 = Math.max(...all.map(p => p[1]), y0 + 1e-9);
  const X = x => P + (x - x0) / (x1 - x0) * (W - 2 * P);
  const Y = y => H - P - (y - y0) / (y1 - y0) * (H - 2 * P);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  const add = (tag, attrs, txt) => { const e = document.createElementNS(ns, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]); if (txt !== undefined) e.textContent = txt;
    svg.appendChild(e); return e; };
  add("line", {x1: P, y1: H - P, x2: W - P, y2: H - P, stroke: "#999"});
  add("line", {x1: P, y1: P, x2: P, y2: H - P, stroke: "#999"});
  add("text", {x: 2, y: P, "font-size": 10}, y1.toPrecision(3));
  add("text", {x: 2, y: H - P, "font-size": 10}, y0.toPrecision(3));
  add("text", {x: W - P - 20, y: H - 8, "font-size": 10}, "round " + x1);
  const colors = ["#1f77b4", "#d62728", "#2ca02c"];
  pts.forEach((p, i) => {
    if (p.length === 0) return;
    add("polyline", {fill: "none", stroke: colors[i], "stroke-width": 2,
                     points: p.map(q => X(q[0]) + "," + Y(q[1])).join(" ")});
    p.forEach(q => add("circle", {cx: X(q[0]), cy: Y(q[1]), r: 2.5, fill: colors[i]}));
    add("text", {x: P + 5 + 100 * i, y: 12, "font-size": 10, fill: colors[i]}, series[i].label);
  });
  fig.appendChild(svg);
  return fig;
}
function render(s) {
  text("run", s.run_id);
  text("phase", "phase: " + s.phase);
  text("progress", "round " + s.round + " of " + s.rounds +
       (s.round_in_progress ? " (running " + s.round_in_progress + ")" : ""));
  text("clients-count", s.clients.length + " clients");
  text("bytes", mb(s.bytes_up) + " up, " + mb(s.bytes_down) + " down");
  text("memory", "server " + mb(s.rss_bytes));
  const rows = s.history.filter(r => !r.evaluation_only).map(r =>
    Object.assign({client_accuracy: r.client_eval ? r.client_eval.accuracy : undefined}, r));
  const charts = document.getElementById("charts");
  charts.replaceChildren(
    chart("accuracy", rows, [{key: "test_accuracy", label: "test"}, {key: "client_accuracy", label: "clients' held-out"}]),
    chart("loss", rows, [{key: "train_loss", label: "train"}, {key: "test_loss", label: "test"}]),
    chart("bytes per round", rows.map(r => ({round: r.round, up: r.bytes_up / 1e6, down: r.bytes_down / 1e6})),
          [{key: "up", label: "MB up"}, {key: "down", label: "MB down"}]),
    chart("round time", rows, [{key: "wall_s", label: "seconds"}]));
  const body = document.querySelector("#clients tbody");
  body.replaceChildren(...s.clients.map(c => {
    const tr = document.createElement("tr");
    if (c.failures > 0) tr.className = "failing";
    [c.name, c.state, c.last_seen_s.toFixed(1) + " s", c.task_s.toFixed(2), (1e3 * c.step_s).toFixed(1),
     c.cut || "", c.uplink_mbps ? c.uplink_mbps.toFixed(1) : "", c.downlink_mbps ? c.downlink_mbps.toFixed(1) : "",
     c.done, c.failures].forEach(v => { const td = document.createElement("td"); td.textContent = v; tr.appendChild(td); });
    return tr;
  }));
  text("config", s.config);
  document.title = "cleave: round " + s.round + " of " + s.rounds;
}
render(INITIAL);
setInterval(() => fetch("/api/state").then(r => r.json()).then(render).catch(() => {}), 1000);
</script>
</body></html>
)HTML";

std::string DashboardHtml(const std::string& initial_state) {
  // The state goes into a <script>: "</" would end it.
  return absl::StrCat(kDashboardHead, absl::StrReplaceAll(initial_state, {{"</", "<\\/"}}),
                      kDashboardTail);
}

}  // namespace cleave
