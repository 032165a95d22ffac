// An arm64 edge client: cleave-client cross-compiled (cmake/aarch64.cmake) and run under
// qemu-user, in a federation with the host's server and a host client over mutual TLS.
// Built only when a cross build is named (CLEAVE_ARM64_BUILD; `make test-arm64`).
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "core/files.h"
#include "privacy/certs.h"
#include "tests/e2e/processes.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

// "trained N examples in S s" lines of a client's log: examples per second, summed.
double ExamplesPerSecond(const std::string& log) {
  static const std::regex line(R"(trained (\d+) examples in ([0-9.]+)s)");
  double examples = 0, seconds = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    examples += std::stod((*it)[1]);
    seconds += std::stod((*it)[2]);
  }
  return seconds > 0 ? examples / seconds : 0;
}

TEST(Arm64Test, AnArm64ClientUnderQemuTrainsInAFederation) {
  const std::string arm_client = std::string(CLEAVE_ARM64_BUILD) + "/bin/cleave-client";
  ASSERT_TRUE(fs::exists(arm_client)) << arm_client << ": run make test-arm64";
  const fs::path dir = fs::temp_directory_path() / ("cleave_arm64_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string fed = (dir / "fed").string();
  ASSERT_EQ(InitFederation(fed), absl::OkStatus());
  for (const char* name : {"host-client", "arm64-client"}) {
    ASSERT_EQ(IssueClientCert(fed, name), absl::OkStatus());
  }
  const std::string config = (dir / "job.yaml").string();
  std::ofstream(config) << R"(
run: {name: e2e-arm64, rounds: 2, seed: 3}
model: {name: mlp}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 2000}
clients: {min: 2, quorum: 1.0, round_deadline_s: 900}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
tls: {mutual: true}
)";
  const fs::path run = dir / "run";
  pid_t server = testing::SpawnBinary(
      {"cleave-server", "--config", config, "--run-dir", run.string(), "--listen", "127.0.0.1:0",
       "--tls-cert", fed + "/server.crt", "--tls-key", fed + "/server.key", "--tls-ca",
       fed + "/ca.crt"},
      (dir / "server.out").string());
  const std::string addr = testing::WaitForAddress(run);
  ASSERT_FALSE(addr.empty()) << ReadFile((dir / "server.out").string()).value_or("");
  auto client_args = [&](const std::string& name, int index) {
    return std::vector<std::string>{
        "--server", addr, "--data", "fmnist:/usr/share/datasets/fashion-mnist,limit=4000",
        "--partition", "iid,client=" + std::to_string(index) + ",of=2", "--ca",
        fed + "/ca.crt", "--cert", fed + "/clients/" + name + ".crt", "--key",
        fed + "/clients/" + name + ".key", "--torch-threads", "1"};
  };
  std::vector<std::string> host = {"cleave-client"};
  for (auto& a : client_args("host-client", 0)) host.push_back(a);
  std::vector<std::string> arm = {"/usr/bin/qemu-aarch64-static", "-L", CLEAVE_ARM64_SYSROOT,
                                  arm_client};
  for (auto& a : client_args("arm64-client", 1)) arm.push_back(a);
  pid_t host_pid = testing::SpawnBinary(host, (dir / "host.log").string());
  pid_t arm_pid = testing::SpawnProcess(arm, (dir / "arm64.log").string());

  // Emulated, the arm64 client trains tens of times slower: bounded by the round deadline.
  const int server_exit = testing::WaitForExit(server, 1800);
  const std::string arm_log = ReadFile((dir / "arm64.log").string()).value_or("");
  EXPECT_EQ(server_exit, 0) << ReadFile((run / "server.log").string()).value_or("") << arm_log;
  EXPECT_EQ(testing::WaitForExit(arm_pid, 60), 0) << arm_log;
  EXPECT_EQ(testing::WaitForExit(host_pid, 60), 0);

  const std::vector<nlohmann::json> rows = testing::MetricsRows(run);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) EXPECT_EQ(r["participants"], 2) << r;
  EXPECT_GT(rows[1]["test_accuracy"].get<double>(), 0.6) << rows[1];
  const std::string server_log = ReadFile((run / "server.log").string()).value_or("");
  EXPECT_NE(server_log.find("(arm64-client) joined"), std::string::npos) << server_log;
  EXPECT_NE(arm_log.find("update uploaded"), std::string::npos) << arm_log;
  // The smoke figure docs/benchmarks.md records: training throughput, emulated and native.
  const double arm_rate = ExamplesPerSecond(arm_log);
  const double host_rate =
      ExamplesPerSecond(ReadFile((dir / "host.log").string()).value_or(""));
  std::printf("arm64 client under qemu: %.0f examples/s; host client: %.0f examples/s (%.1fx)\n",
              arm_rate, host_rate, arm_rate > 0 ? host_rate / arm_rate : 0);
  if (!getenv("KEEP")) fs::remove_all(dir);
}

}  // namespace
}  // namespace cleave
