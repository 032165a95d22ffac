// The operator's view (server/observe/observe.h): Prometheus' exposition format with bounded
// per-client series, the dashboard's JSON and page; the endpoint serving them from a
// running server; and the rounds' update noise (server/observe/update_noise.h).
#include "server/observe/observe.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <random>

#include "client/transfer.h"
#include "server/observe/observe_http.h"
#include "server/observe/update_noise.h"
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

// Updates G + noise: 4,000 values, G of squared norm 4000 * 0.1^2 = 40 and noise of
// variance 4000 * 0.2^2 = 160 per update; weights 1, 1, 2, 4. The estimates of one round
// of four land within 15 % (of 4,000 values each); their ratio is the noise scale, 4.
TEST(UpdateNoiseTest, EstimatesTheUpdatesNoiseAndSignal) {
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0, 0.2f);
  constexpr int kValues = 4000;
  const std::vector<double> weights = {1, 1, 2, 4};
  UpdateNoiseMeter meter;
  std::vector<double> mean(kValues, 0);
  for (double w : weights) {
    ParameterSet u;
    Tensor t{"w", {kValues}, std::vector<float>(kValues)};
    for (int i = 0; i < kValues; ++i) {
      t.values[i] = 0.1f + noise(rng);
      mean[i] += w * t.values[i] / 8;
    }
    ASSERT_TRUE(u.Add(std::move(t)).ok());
    meter.Add(ViewsOf(u), w);
  }
  EXPECT_FALSE(UpdateNoiseMeter().Estimate(1).has_value()) << "no updates, no estimate";
  double b = 0;
  for (double m : mean) b += m * m;
  const std::optional<UpdateNoise> e = meter.Estimate(b);
  ASSERT_TRUE(e.has_value());
  EXPECT_NEAR(e->noise, 160, 160 * 0.15);
  EXPECT_NEAR(e->signal, 40, 40 * 0.15);
  meter.Reset();
  EXPECT_FALSE(meter.Estimate(b).has_value());
}

class UpdateNoiseServerTest : public RunningServerTest {
 protected:
  // One fedavg round of two clients uploading deltas of every value 0.01 and 0.03 (100
  // examples each), under `strategy`; the round's metrics.
  RoundMetrics Round(const std::string& strategy) {
    ServerOptions o;
    o.measure_update_noise = true;
    o.config = TestConfig("run: {rounds: 1}\nmodel: {name: mlp}\nstrategy: {name: " + strategy +
                          "}\nclients: {min: 2, round_deadline_s: 60}\nserver: {client_timeout_s: 120}\n");
    StartServerWith(std::move(o));
    const ParameterSet initial = server_->GlobalModel();
    TestPeer a(address_, 100), b(address_, 100);
    EXPECT_TRUE(a.Join("a") && b.Join("b"));
    auto ta = a.NextTask(), tb = b.NextTask();
    if (!ta || !tb) return {};
    float v = 0.01f;
    for (auto [peer, task] : {std::pair{&a, &*ta}, std::pair{&b, &*tb}}) {
      ParameterSet d = initial.ZerosLike();
      for (Tensor& t : d.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), v);
      EXPECT_TRUE(UploadPayload(peer->stub(), peer->Header(*task, 100), d.Encode()).ok());
      v = 0.03f;
    }
    runner_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_;
    const std::vector<RoundMetrics> h = server_->History();
    return h.empty() ? RoundMetrics{} : h[0];
  }
};

// With n values: A = n (0.01^2 + 0.03^2) / 2 and B = n 0.02^2, n_eff 2: noise
// (A - B) / (1 - 1/2) = n 0.0002, signal B - noise / 2 = n 0.0003.
TEST_F(UpdateNoiseServerTest, AFedAvgRoundMeasuresItsUpdatesSpread) {
  const RoundMetrics m = Round("fedavg");
  ASSERT_TRUE(m.update_noise.has_value());
  const double n = static_cast<double>(server_->GlobalModel().total_elements());
  EXPECT_NEAR(m.update_noise->noise, n * 0.0002, n * 0.0002 * 1e-3);
  EXPECT_NEAR(m.update_noise->signal, n * 0.0003, n * 0.0003 * 1e-3);
}

// FedAdam's step is not the updates' mean: nothing is measured.
TEST_F(UpdateNoiseServerTest, NotWhereTheStepIsNotTheMean) {
  EXPECT_FALSE(Round("fedadam").update_noise.has_value());
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
