// An operator watching a real run: Debian's Prometheus scrapes the server's /metrics and
// answers queries about it, and headless Chromium renders the dashboard, whose content
// follows the rounds as they commit.
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "core/files.h"
#include "tests/e2e/processes.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

void Kill(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  testing::WaitForExit(pid, 20);
}

// A port nothing listens on now (bound, read and closed).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  close(fd);
  return ntohs(a.sin_port);
}

class ObserveE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cleave_observe_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!getenv("KEEP")) fs::remove_all(dir_);
  }
  fs::path dir_;
};

// The run: 3 clients whose compute is slowed 20x, so that its 10 rounds last long
// enough to be watched (a round takes most of a second).
constexpr char kJob[] = R"(
run: {name: watched, rounds: 10, seed: 3}
model: {name: mlp}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 1000}
clients: {min: 3, quorum: 1.0, round_deadline_s: 120}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
server: {metrics_listen: "127.0.0.1:0"}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=3000", partition: iid, clients: 3,
        profiles: [{slowdown: 20}]}
)";

TEST_F(ObserveE2eTest, PrometheusScrapesTheServerAndTheDashboardFollowsTheRun) {
  ASSERT_TRUE(fs::exists("/usr/bin/prometheus")) << "scripts/install-deps.sh installs prometheus";
  ASSERT_TRUE(fs::exists("/usr/bin/chromium")) << "scripts/install-deps.sh installs chromium";
  const std::string job = (dir_ / "job.yaml").string();
  std::ofstream(job) << kJob;
  const fs::path run = dir_ / "run";
  const pid_t local = testing::SpawnBinary(
      {"cleave", "local", "--insecure", "--config", job, "--run-dir", run.string()},
      (dir_ / "local.txt").string());
  std::string addr;  // http://127.0.0.1:PORT
  for (int i = 0; i < 600 && addr.empty(); ++i) {
    auto a = ReadFile((run / "metrics.addr").string());
    if (a.ok()) addr = a->substr(0, a->find('\n'));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(addr.empty()) << ReadFile((dir_ / "local.txt").string()).value_or("");
  const std::string target = addr.substr(std::string("http://").size());

  // Prometheus scrapes it every second.
  const int prom_port = FreePort();
  std::ofstream(dir_ / "prometheus.yml") << "global: {scrape_interval: 1s}\n"
                                            "scrape_configs:\n"
                                            "  - job_name: cleave\n"
                                            "    static_configs: [{targets: [\""
                                         << target << "\"]}]\n";
  const pid_t prom = testing::SpawnProcess(
      {"/usr/bin/prometheus", "--config.file=" + (dir_ / "prometheus.yml").string(),
       "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
       "--web.listen-address=127.0.0.1:" + std::to_string(prom_port)},
      (dir_ / "prometheus.txt").string());

  // The dashboard, rendered by headless Chromium now and again a few rounds later.
  auto dashboard = [&](const std::string& extra) {
    const std::string out = (dir_ / "chromium.txt").string();
    const pid_t c = testing::SpawnProcess({"/usr/bin/chromium", "--headless", "--no-sandbox", "--disable-gpu",
                               "--disable-dev-shm-usage", "--no-first-run",
                               "--disable-background-networking", "--disable-component-update",
                               "--disable-sync", "--user-data-dir=" + (dir_ / "chrome").string(),
                               "--virtual-time-budget=1500", extra, addr + "/"},
                              out);
    EXPECT_EQ(testing::WaitForExit(c, 120), 0) << ReadFile(out).value_or("");
    return ReadFile(out).value_or("");
  };
  auto round_shown = [](const std::string& dom) {
    std::smatch m;
    return std::regex_search(dom, m, std::regex("round (\\d+) of 10")) ? std::stoi(m[1]) : -1;
  };
  const std::string first = dashboard("--dump-dom");
  const int shown_first = round_shown(first);
  ASSERT_GE(shown_first, 0) << first;
  EXPECT_NE(first.find("metrics_listen"), std::string::npos) << "its configuration";
  // Render it again once the server has committed a later round (waiting on the run's
  // progress, not a fixed time: on a loaded machine the first round may take long).
  {
    const size_t colon = target.rfind(':');
    httplib::Client server(target.substr(0, colon), std::stoi(target.substr(colon + 1)));
    int committed = shown_first;
    for (int i = 0; i < 1200 && committed <= shown_first; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (auto r = server.Get("/api/state"); r && r->status == 200) {
        const auto state = nlohmann::json::parse(r->body, nullptr, false);
        if (state.is_object()) committed = state.value("round", shown_first);
      }
    }
    ASSERT_GT(committed, shown_first) << "the run made no progress in 120 s";
  }
  const std::string later = dashboard("--dump-dom");
  EXPECT_GT(round_shown(later), shown_first) << later;
  EXPECT_NE(later.find("client-2"), std::string::npos) << "its clients are listed";
  dashboard("--screenshot=" + (dir_ / "dashboard.png").string());
  EXPECT_GT(fs::file_size(dir_ / "dashboard.png"), 10000u);

  ASSERT_EQ(testing::WaitForExit(local, 300), 0)
      << ReadFile((dir_ / "local.txt").string()).value_or("");
  // What Prometheus recorded: the rounds rose, three clients were connected.
  httplib::Client api("127.0.0.1", prom_port);
  auto query = [&](const std::string& q) -> double {
    for (int i = 0; i < 100; ++i) {
      auto r = api.Get("/api/v1/query", httplib::Params{{"query", q}}, httplib::Headers{});
      if (r && r->status == 200) {
        const auto j = nlohmann::json::parse(r->body);
        const auto& result = j["data"]["result"];
        if (!result.empty()) return std::stod(result[0]["value"][1].get<std::string>());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return -1;
  };
  EXPECT_GE(query("max_over_time(cleave_round[10m])"), 3)
      << ReadFile((dir_ / "prometheus.txt").string()).value_or("");
  EXPECT_EQ(query("max_over_time(cleave_connected_clients[10m])"), 3);
  EXPECT_GT(query("max_over_time(cleave_test_accuracy[10m])"), 0.5);
  EXPECT_GT(query("max_over_time(cleave_upload_seconds_count[10m])"), 3);
  Kill(prom);
}


// A device's own /metrics (cleave-client --metrics-listen): scraped while it trains, it
// shows the client joined and counting its tasks and bytes. Off the loopback it needs a
// certificate to serve HTTPS, and without one the client refuses to start.
TEST_F(ObserveE2eTest, AClientServesItsOwnMetrics) {
  const std::string job = (dir_ / "job.yaml").string();
  std::ofstream(job) << R"(
run: {name: device-metrics, rounds: 2, seed: 3}
model: {name: mlp}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 500}
clients: {min: 1, quorum: 1.0, round_deadline_s: 120}
train: {local_epochs: 1, batch_size: 32, lr: 0.05}
)";
  const fs::path run = dir_ / "run";
  const pid_t server = testing::SpawnBinary({"cleave-server", "--config", job, "--run-dir",
                                             run.string(), "--listen", "127.0.0.1:0", "--insecure"},
                                            (dir_ / "server.txt").string());
  const std::string addr = testing::WaitForAddress(run);
  ASSERT_FALSE(addr.empty()) << ReadFile((dir_ / "server.txt").string()).value_or("");
  const std::vector<std::string> client = {
      "cleave-client", "--server", addr, "--insecure", "--name", "device-0",
      "--data", "fmnist:/usr/share/datasets/fashion-mnist,limit=1000", "--emulate-slowdown", "20"};
  auto with = [](std::vector<std::string> argv, std::vector<std::string> more) {
    argv.insert(argv.end(), more.begin(), more.end());
    return argv;
  };
  const fs::path refused_log = dir_ / "refused.txt";
  const pid_t refused = testing::SpawnBinary(with(client, {"--metrics-listen", "0.0.0.0:0"}),
                                             refused_log.string());
  EXPECT_EQ(testing::WaitForExit(refused, 60), 2);
  EXPECT_NE(ReadFile(refused_log.string()).value_or("").find("HTTPS with --cert and --key"),
            std::string::npos)
      << ReadFile(refused_log.string()).value_or("");

  const fs::path log = dir_ / "client.txt";
  const pid_t device = testing::SpawnBinary(with(client, {"--metrics-listen", "127.0.0.1:0"}),
                                            log.string());
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {
    std::smatch m;
    const std::string text = ReadFile(log.string()).value_or("");
    if (std::regex_search(text, m, std::regex("device metrics: http://127.0.0.1:(\\d+)/metrics"))) {
      port = std::stoi(m[1]);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ASSERT_GT(port, 0) << ReadFile(log.string()).value_or("");
  httplib::Client http("127.0.0.1", port);
  std::string body;
  for (int i = 0; i < 1200; ++i) {  // until a task is done (each trains for about a second)
    auto r = http.Get("/metrics");
    if (r && r->status == 200) body = r->body;
    if (body.find("cleave_device_tasks_done_total 0\n") == std::string::npos &&
        body.find("cleave_device_tasks_done_total") != std::string::npos) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(body.find("cleave_device_connected 1\n"), std::string::npos) << body;
  EXPECT_NE(body.find("cleave_device_examples 1000\n"), std::string::npos) << body;
  EXPECT_EQ(body.find("cleave_device_tasks_done_total 0\n"), std::string::npos) << body;
  EXPECT_EQ(body.find("cleave_device_bytes_received_total 0\n"), std::string::npos) << body;
  EXPECT_NE(body.find("cleave_device_info{run_id=\"device-metrics-"), std::string::npos) << body;
  EXPECT_EQ(testing::WaitForExit(server, 300), 0) << ReadFile((dir_ / "server.txt").string()).value_or("");
  EXPECT_EQ(testing::WaitForExit(device, 60), 0) << ReadFile(log.string()).value_or("");
}

}  // namespace
}  // namespace cleave
