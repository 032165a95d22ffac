// The operator's view (server/observe/observe.h): Prometheus' exposition format with bounded
// per-client series, the dashboard's JSON and page; and the endpoint serving them from a
// running server.
#include "server/observe/observe.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "server/observe/observe_http.h"
#include "tests/server/running_server.h"
#include "tests/server/test_peer.h"

namespace cleave {
namespace {

ObservedState Sample() {
  ObservedState s;
  s.run_id = "run-\"1\"";
  s.phase = "training";
  s.committed_round = 3;
  s.current_round = 4;
  s.total_rounds = 10;
  RoundMetrics m;
  m.round = 3;
  m.evaluated = true;
  m.test_accuracy = 0.75;
  m.participants = 2;
  m.failures = 1;
  s.last_round = m;
  s.task_failures = 4;
  s.bytes_up = 1000;
  for (const char* name : {"b", "a", "c"}) {
    ClientHealth c;
    c.name = name;
    c.state = "idle";
    c.failures = std::string(name) == "c" ? 3 : 0;
    c.done = 5;
    s.clients.push_back(c);
  }
  LatencyHistogram h;
  h.Observe(0.003);
  h.Observe(0.3);
  h.Observe(100);
  s.upload_s = h.Get();
  return s;
}

TEST(ObserveTest, PrometheusTextHasEveryFamilyAndBoundedClientSeries) {
  const std::string t = PrometheusText(Sample(), 2);
  for (const char* line :
       {"cleave_round 3\n", "cleave_round_in_progress 4\n", "cleave_test_accuracy 0.75\n",
        "cleave_task_failures_total 4\n", "cleave_bytes_up_total 1000\n",
        "cleave_connected_clients 3\n", "cleave_client_series_dropped 1\n",
        "# TYPE cleave_upload_seconds histogram\n", "cleave_upload_seconds_bucket{le=\"0.005\"} 1\n",
        "cleave_upload_seconds_bucket{le=\"0.5\"} 2\n",
        "cleave_upload_seconds_bucket{le=\"30\"} 2\n",
        "cleave_upload_seconds_bucket{le=\"+Inf\"} 3\n", "cleave_upload_seconds_count 3\n",
        "cleave_info{run_id=\"run-\\\"1\\\"\",phase=\"training\"} 1\n",
        "cleave_client_task_failures_total{client=\"c\"} 3\n",
        "cleave_client_tasks_done_total{client=\"a\"} 5\n"}) {
    EXPECT_NE(t.find(line), std::string::npos) << line << "\n" << t;
  }
  // Two series a metric: the failing client first, then by name; b is left out.
  EXPECT_EQ(t.find("client=\"b\""), std::string::npos) << t;
  // Every sample line is NAME[{labels}] VALUE.
  std::istringstream lines(t);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    ASSERT_NE(space, std::string::npos) << line;
    EXPECT_NO_THROW(std::stod(line.substr(space + 1))) << line;
  }
}

TEST(ObserveTest, StateJsonAndTheDashboardCarryTheRun) {
  ObservedState s = Sample();
  s.history = {*s.last_round};
  s.config_yaml = "run: {name: x}  # </script><script>alert(1)</script>";
  const std::string json = StateJson(s);
  const auto j = nlohmann::json::parse(json);
  EXPECT_EQ(j["round"], 3);
  EXPECT_EQ(j["clients"].size(), 3u);
  EXPECT_EQ(j["history"][0]["test_accuracy"], 0.75);
  const std::string page = DashboardHtml(json);
  EXPECT_NE(page.find("cleave dashboard"), std::string::npos);
  EXPECT_EQ(page.find("</script><script>alert"), std::string::npos) << "the state cannot end the script";
  EXPECT_EQ(page.find("http://"), page.find("http://www.w3.org/2000/svg")) << "nothing fetched from elsewhere";
}

class ObserveEndpointTest : public RunningServerTest {};

// A running server serves /metrics, /api/state and / on its operator port.
TEST_F(ObserveEndpointTest, ARunningServerServesMetricsStateAndDashboard) {
  ServerOptions o;
  o.config = TestConfig(R"(
run: {rounds: 1}
model: {name: mlp}
clients: {min: 3, round_deadline_s: 60}
server: {client_timeout_s: 120, metrics_listen: "127.0.0.1:0"}
)");
  StartServerWith(std::move(o));
  ASSERT_GT(server_->metrics_port(), 0);
  TestPeer a(address_, 100), b(address_, 100);
  ASSERT_TRUE(a.Join("alpha"));
  ASSERT_TRUE(b.Join("beta"));
  httplib::Client http("127.0.0.1", server_->metrics_port());
  auto metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("cleave_connected_clients 2\n"), std::string::npos) << metrics->body;
  EXPECT_NE(metrics->body.find("cleave_client_last_seen_seconds{client=\"beta\"}"),
            std::string::npos);
  auto state = http.Get("/api/state");
  ASSERT_TRUE(state);
  const auto j = nlohmann::json::parse(state->body);
  EXPECT_EQ(j["clients"].size(), 2u);
  EXPECT_EQ(j["clients"][0]["name"], "alpha");
  auto page = http.Get("/");
  ASSERT_TRUE(page);
  EXPECT_NE(page->body.find("cleave dashboard"), std::string::npos);
  EXPECT_EQ(http.Get("/nothing")->status, 404);
}

TEST(ObserveEndpointConfigTest, OffTheLoopbackOnlyOverHttps) {
  auto e = StartObserveEndpoint(nullptr, "0.0.0.0:0", "", "", 10);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
  EXPECT_NE(e.status().message().find("HTTPS"), std::string::npos);
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.7"));
}

}  // namespace
}  // namespace cleave
