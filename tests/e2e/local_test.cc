// `cleave local` as a user runs it: real processes, real ports, real files.
#include <gtest/gtest.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "core/parameter_set.h"
#include "tests/e2e/processes.h"
#include "privacy/certs.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

class LocalTest : public ::testing::Test {
 protected:
  // The chaos test's body (below), with `scheduler` appended to its config.
  void SurviveKillsAndRestarts(const std::string& scheduler);
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cleave_e2e_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    config_ = (dir_ / "job.yaml").string();
    std::ofstream(config_) << R"(
run: {name: e2e, rounds: 2}
model: {name: mlp}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 2000}
clients: {min: 3, quorum: 1.0, round_deadline_s: 60}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=6000", partition: iid, clients: 3}
)";
  }
  void TearDown() override {
    if (!getenv("KEEP")) fs::remove_all(dir_);
  }

  // Starts `cleave local` on dir_/`run` with output to dir_/out.txt.
  pid_t Start(const std::vector<std::string>& extra, const std::string& run = "run") {
    std::vector<std::string> argv = {"cleave", "local", "--config", config_, "--run-dir",
                                     (dir_ / run).string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return Spawn(argv);
  }

  // Starts build/bin/`argv[0]` with output to dir_/`out` (default out.txt), and with
  // at most `max_fds` descriptors when that is not 0.
  pid_t Spawn(std::vector<std::string> argv, const std::string& out_name = "out.txt",
              rlim_t max_fds = 0) {
    return testing::SpawnBinary(std::move(argv), (dir_ / out_name).string(), max_fds);
  }

  int Wait(pid_t pid, int timeout_s) { return testing::WaitForExit(pid, timeout_s); }

  void ExpectRunSurvivesIdleConnections(
      const std::string& yaml, rlim_t max_fds, int rounds,
      const std::function<void(const std::string& addr, pid_t server, std::vector<int>* idle)>&
          attack);

  std::string Output() { return ReadFile((dir_ / "out.txt").string()).value_or(""); }

  // Processes of this run: cleave and the server name the run directory, the clients
  // name the server's address.
  int ProcessesUsing(const std::string& addr) {
    const std::string run_dir = (dir_ / "run").string();
    int n = 0;
    for (const auto& e : fs::directory_iterator("/proc")) {
      auto cmd = ReadFile((e.path() / "cmdline").string());
      if (cmd.ok() && (cmd->find(addr) != std::string::npos ||
                       cmd->find(run_dir) != std::string::npos)) {
        ++n;
      }
    }
    return n;
  }

  fs::path dir_;
  std::string config_;
};

TEST_F(LocalTest, RunsAFederationForTwoRounds) {
  pid_t pid = Start({});
  ASSERT_EQ(Wait(pid, 300), 0) << Output();
  const std::string out = Output();
  EXPECT_NE(out.find("round   1/2"), std::string::npos) << out;
  EXPECT_NE(out.find("round   2/2"), std::string::npos) << out;
  EXPECT_NE(out.find("done: 2 rounds"), std::string::npos) << out;
  // TLS by default, with a CA and server certificate made for the run.
  EXPECT_NE(out.find(", TLS\n"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(dir_ / "run" / "certs" / "ca.crt"));
  EXPECT_NE(ReadFile((dir_ / "run" / "server.log").string())->find("TLS on"), std::string::npos);

  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_EQ(rows.size(), 2u);
  for (const char* key : {"round", "test_accuracy", "test_loss", "train_loss", "participants",
                          "failures", "bytes_up", "bytes_down", "wall_s"}) {
    EXPECT_TRUE(rows[1].contains(key)) << key;
  }
  EXPECT_EQ(rows[1]["participants"], 3);
  EXPECT_GT(rows[1]["test_accuracy"].get<double>(), 0.65);
  EXPECT_TRUE(fs::exists(dir_ / "run" / "checkpoint.pb"));
  EXPECT_FALSE(fs::exists(dir_ / "run" / "checkpoint.pb.tmp")) << "a finished run leaves no spare";
  EXPECT_TRUE(fs::exists(dir_ / "run" / "server.log"));
  EXPECT_TRUE(fs::exists(dir_ / "run" / "config.yaml"));
  // `make demo` ends with the report's path.
  EXPECT_NE(out.find("report: " + (dir_ / "run" / "report.html").string()), std::string::npos) << out;
  EXPECT_NE(ReadFile((dir_ / "run" / "report.html").string())->find("<polyline"), std::string::npos);
  auto addr = ReadFile((dir_ / "run" / "server.addr").string());
  ASSERT_TRUE(addr.ok());
  EXPECT_EQ(ProcessesUsing(addr->substr(0, addr->size() - 1)), 0);
}

// `cleave simulate`: hundreds of virtual clients in one process, on the in-process
// channel, each with its part of the data; the sampled ones train and the model learns.
// A seeded simulation repeats itself, although its 500 clients join in a racing order.
TEST_F(LocalTest, SimulatesHundredsOfVirtualClientsInOneProcess) {
  std::ofstream(config_) << R"(
run: {name: sim, rounds: 3, seed: 3}
model: {name: mlp}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 2000}
clients: {min: 500, per_round: 50, quorum: 1.0, round_deadline_s: 120}
train: {local_epochs: 2, batch_size: 10, lr: 0.1}
server: {heartbeat_s: 5, client_timeout_s: 60}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=6000", partition: iid, clients: 500}
)";
  std::vector<double> last_accuracy;
  for (const char* run : {"run", "again"}) {
    pid_t pid = Spawn({"cleave", "simulate", "--config", config_, "--run-dir", (dir_ / run).string()});
    ASSERT_EQ(Wait(pid, 300), 0) << Output();
    const std::string out = Output();
    EXPECT_NE(out.find("500 virtual clients in this process (6000 examples)"), std::string::npos)
        << out;
    EXPECT_NE(out.find("done: 3 rounds"), std::string::npos) << out;
    EXPECT_NE(out.find("peak memory"), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(dir_ / run / "server.addr")) << "no port was opened";
    const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / run);
    ASSERT_EQ(rows.size(), 3u);
    for (const auto& r : rows) {
      EXPECT_EQ(r["participants"], 50);
      EXPECT_EQ(r["failures"], 0);
    }
    EXPECT_GT(rows[2]["test_accuracy"].get<double>(), rows[0]["test_accuracy"].get<double>());
    EXPECT_GT(rows[2]["test_accuracy"].get<double>(), 0.4);
    last_accuracy.push_back(rows[2]["test_accuracy"].get<double>());
  }
  // The same clients sampled, each training on its own part: the same model, to float
  // summation order (updates arrive in a racing order). Sampling by join order varied
  // the last accuracy from 0.45 to 0.62.
  EXPECT_NEAR(last_accuracy[0], last_accuracy[1], 0.002);

  // Refusals name the problem.
  std::ofstream(config_, std::ios::app) << "tls: {mutual: true}\n";
  pid_t pid = Spawn({"cleave", "simulate", "--config", config_, "--run-dir", (dir_ / "r2").string()},
                    "out2.txt");
  EXPECT_EQ(Wait(pid, 60), 2);
  EXPECT_NE(ReadFile((dir_ / "out2.txt").string())->find("virtual clients have no certificates"),
            std::string::npos);
}

// Decentralised rounds in one process: the server in-process, the virtual clients
// exchanging models peer to peer over loopback, each serving Peer on a port of its own.
TEST_F(LocalTest, SimulatesGossipRounds) {
  std::ofstream(config_) << R"(
run: {name: sim-gossip, rounds: 3, seed: 3}
model: {name: mlp}
data: {test: ""}
server: {evaluate: false}
clients: {min: 12, quorum: 1.0, round_deadline_s: 120}
scheduler: {mode: gossip, topology: random, degree: 4}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=6000", partition: iid, clients: 12,
        holdout: 0.2}
)";
  pid_t pid = Spawn({"cleave", "simulate", "--config", config_, "--run-dir", (dir_ / "run").string()});
  ASSERT_EQ(Wait(pid, 300), 0) << Output();
  EXPECT_NE(Output().find("12 virtual clients in this process"), std::string::npos) << Output();
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_EQ(rows.size(), 3u);
  for (const auto& row : rows) {
    ASSERT_TRUE(row.contains("gossip")) << row;
    EXPECT_EQ(row["participants"], 12) << row;
    EXPECT_GE(row["gossip"]["neighbours"].get<int>(), 2 * 12) << row;
    EXPECT_EQ(row["gossip"]["heard"], row["gossip"]["neighbours"]) << row;
    EXPECT_GT(row["gossip"]["peer_bytes"].get<int64_t>(), 0) << row;
  }
  EXPECT_GT(rows[2]["client_eval"]["accuracy"].get<double>(),
            rows[0]["client_eval"]["accuracy"].get<double>() + 0.2);
}

// Devices of three widths (section width) as processes; `cleave evaluate --width`
// measures a tier's submodel of the run's model.
TEST_F(LocalTest, TrainsWidthScaledSubmodelsAndEvaluatesATier) {
  std::ofstream(config_) << R"(
run: {name: widths, rounds: 2, seed: 3}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 1000}
clients: {min: 3, quorum: 1.0, round_deadline_s: 120}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9, clip_norm: 2}
width: {clients: [{name: client-1, rate: 0.5}, {name: client-2, rate: 0.25}]}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=3000", partition: iid, clients: 3}
)";
  pid_t pid = Spawn({"cleave", "local", "--insecure", "--config", config_, "--run-dir", (dir_ / "run").string()});
  ASSERT_EQ(Wait(pid, 300), 0) << Output();
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1]["widths"], nlohmann::json({{"client-0", 1.0}, {"client-1", 0.5}, {"client-2", 0.25}}));
  pid = Spawn({"cleave", "evaluate", (dir_ / "run").string(), "--width", "0.5", "--data",
               "fmnist:/usr/share/datasets/fashion-mnist,limit=1000"},
              "eval.txt");
  ASSERT_EQ(Wait(pid, 120), 0) << ReadFile((dir_ / "eval.txt").string()).value_or("");
  const std::string table = ReadFile((dir_ / "eval.txt").string()).value_or("");
  EXPECT_NE(table.find("| all | 1000 |"), std::string::npos) << table;
}

// A decoder of two widths as processes (every block's heads and MLP features halved on
// client-1); `cleave evaluate --width 0.5` measures the half-width decoder, its heads
// gathered from the run's model.
TEST_F(LocalTest, TrainsAWidthScaledDecoderAndEvaluatesATier) {
  std::ofstream(config_) << R"(
run: {name: decoder-widths, rounds: 1, seed: 3}
model: {name: gpt, gpt: {vocab: 256, context: 32, layers: 1, heads: 2, dim: 32}}
data: {test: "text:/usr/share/games/fortunes/pets,context=32", test_limit: 64}
clients: {min: 2, quorum: 1.0, round_deadline_s: 120}
train: {local_steps: 5, batch_size: 16, optimizer: adamw, lr: 0.003}
width: {method: fedrolex, clients: [{name: client-1, rate: 0.5}]}
local: {data: "text:/usr/share/games/fortunes/pets,context=32", partition: iid, clients: 2}
)";
  pid_t pid = Spawn({"cleave", "local", "--insecure", "--config", config_, "--run-dir", (dir_ / "run").string()});
  ASSERT_EQ(Wait(pid, 300), 0) << Output();
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0]["widths"], nlohmann::json({{"client-0", 1.0}, {"client-1", 0.5}}));
  pid = Spawn({"cleave", "evaluate", (dir_ / "run").string(), "--width", "0.5", "--data",
               "text:/usr/share/games/fortunes/pets,context=32,limit=16"},
              "eval.txt");
  ASSERT_EQ(Wait(pid, 120), 0) << ReadFile((dir_ / "eval.txt").string()).value_or("");
  const std::string table = ReadFile((dir_ / "eval.txt").string()).value_or("");
  EXPECT_NE(table.find("| all | 16 |"), std::string::npos) << table;
}

// Interoperable architectures as processes: three clients with bases of three
// architectures keep them in their state directories and report their held-out accuracy;
// the run's checkpoint holds the shared block only, so `cleave evaluate` says why it
// cannot load a whole model.
TEST_F(LocalTest, PrivateBasesOfThreeArchitecturesAsProcesses) {
  std::ofstream(config_) << R"(
run: {name: interop, rounds: 2, seed: 3}
model: {name: interop, interop: {base: mlp, width: 32, clients: [{name: client-1, base: lenet5}, {name: client-2, base: cnn}]}}
data: {test: ""}
clients: {min: 3, quorum: 1.0, round_deadline_s: 120}
train: {local_epochs: 1, batch_size: 32, optimizer: adam, lr: 0.002}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=3000", partition: iid, clients: 3, holdout: 0.1}
)";
  pid_t pid = Spawn({"cleave", "local", "--insecure", "--config", config_, "--run-dir", (dir_ / "run").string()});
  ASSERT_EQ(Wait(pid, 300), 0) << Output();
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows.back()["client_eval"]["clients"], 3) << rows.back();
  EXPECT_GT(rows.back()["client_eval"]["accuracy"].get<double>(), 0.4) << rows.back();
  for (const char* name : {"client-0", "client-1", "client-2"}) {
    EXPECT_TRUE(std::filesystem::exists(dir_ / "run" / "clients" / name / "personal.pb")) << name;
  }
  pid = Spawn({"cleave", "evaluate", (dir_ / "run").string()}, "eval.txt");
  EXPECT_NE(Wait(pid, 120), 0);
  EXPECT_NE(ReadFile((dir_ / "eval.txt").string()).value_or("").find("shared block only"), std::string::npos);
}

// Memory tiers from `cleave trace --tiers` (the trace's memory_mb) become each virtual
// device's training budget, and width.assign: profile gives each the largest rate it
// holds: the MLP takes about 3.2, 1.5 and 0.8 MiB to train at rates 1, 1/2 and 1/4.
TEST_F(LocalTest, ASimulationAssignsWidthsFromItsDevicesMemoryTiers) {
  const std::string trace = (dir_ / "tiers.csv").string();
  pid_t pid = Spawn({"cleave", "trace", "--clients", "3", "--tiers", "64:1,2:1,1:1", "--out", trace}, "trace.txt");
  ASSERT_EQ(Wait(pid, 60), 0) << ReadFile((dir_ / "trace.txt").string()).value_or("");
  std::ofstream(config_) << R"(
run: {name: tiers, rounds: 2, seed: 3}
model: {name: mlp}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 500}
clients: {min: 3, quorum: 1.0, round_deadline_s: 120}
train: {local_epochs: 1, batch_size: 32, lr: 0.1}
width: {assign: profile}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=3000", partition: iid, clients: 3, trace: )"
                         << trace << "}\n";
  pid = Spawn({"cleave", "simulate", "--config", config_, "--run-dir", (dir_ / "run").string()});
  ASSERT_EQ(Wait(pid, 300), 0) << Output();
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1]["widths"], nlohmann::json({{"sim-0", 1.0}, {"sim-1", 0.5}, {"sim-2", 0.25}}));
  EXPECT_GT(rows[1]["test_accuracy"].get<double>(), 0.3) << "it learns (0.1 at the start)";
}

// A curious server's token attack on what it recorded (split.record) of a decoder cut
// after its embedding: every token whose label crossed is recovered, unless the devices
// drown their activations in noise (split.activation_noise). A U-shaped run's record
// holds no labels.
// The number `format` reads (one stored conversion) where its text before the first '%'
// first occurs in `text`; NaN when it is not there.
double Number(const std::string& text, const std::string& format) {
  const size_t at = text.find(format.substr(0, format.find('%')));
  double v = std::nan("");
  if (at == std::string::npos || std::sscanf(text.c_str() + at, format.c_str(), &v) != 1) return std::nan("");
  return v;
}

// A decoder's tokens from real runs' records: at the embedding cut the nearest embedding
// recovers every one; a learned inverter recovers most there and after a block too;
// activation noise costs both (the learned one, trained under the same noise, less).
TEST_F(LocalTest, ACuriousServerRecoversTokensAtTheEmbeddingCut) {
  double learned_clean = 0;
  for (const auto& [cut, noise] : std::vector<std::pair<int, int>>{{1, 0}, {1, 1}, {2, 0}}) {
    SCOPED_TRACE(absl::StrCat("cut ", cut, ", noise ", noise));
    std::ofstream(config_) << "run: {name: att, rounds: 1, seed: 1}\n"
                           << "model: {name: gpt, gpt: {vocab: 256, context: 32, layers: 2, heads: 2, dim: 32}}\n"
                           << "data: {test: \"text:/usr/share/games/fortunes,context=32\", test_limit: 64}\n"
                           << "clients: {min: 2, quorum: 1.0, round_deadline_s: 120}\n"
                           << "train: {local_steps: 5, batch_size: 8, optimizer: adamw, lr: 0.002}\n"
                           << "split: {mode: sfl-v2, cut: " << cut << ", record: 2, activation_noise: " << noise << "}\n"
                           << "local: {data: \"text:/usr/share/games/fortunes,context=32\", partition: natural, "
                           << "clients: 2}\n";
    const std::string run = absl::StrCat("run", cut, noise);
    ASSERT_EQ(Wait(Start({}, run), 300), 0) << Output();
    ASSERT_EQ(Wait(Spawn({"cleave", "attack", "tokens", (dir_ / run).string(), "--steps", "300"}, "attack.txt"), 120), 0)
        << ReadFile((dir_ / "attack.txt").string()).value_or("");
    const std::string out = ReadFile((dir_ / "attack.txt").string()).value_or("");
    // Two devices, two recorded micro-batches each of 8 sequences: 31 checked positions each.
    const double learned = Number(out, "total: the learned inverter recovered %*d of 992 tokens (%lf %%)");
    if (cut == 2) {
      EXPECT_EQ(out.find("total: recovered"), std::string::npos) << "the nearest embedding is the first cut's\n" << out;
      EXPECT_GT(learned, 40) << out;
    } else if (noise == 0) {
      EXPECT_NE(out.find("total: recovered 992 of 992 tokens (100.00 %)"), std::string::npos) << out;
      EXPECT_GT(learned, 50) << out;
      learned_clean = learned;
    } else {
      EXPECT_LT(Number(out, "total: recovered %*d of 992 tokens (%lf %%)"), 10) << out;
      EXPECT_LT(learned, learned_clean - 20) << out;
    }
  }
  ASSERT_NE(Wait(Spawn({"cleave", "attack", "tokens", dir_.string()}, "none.txt"), 60), 0);
  EXPECT_NE(ReadFile((dir_ / "none.txt").string())->find("no records"), std::string::npos);

  // U-shaped: the record holds the activations and the gradient the server received, and
  // no labels (they stay on the device); the token attack has nothing to go on.
  std::ofstream(config_) << R"(
run: {name: att-u, rounds: 1, seed: 1}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 200}
clients: {min: 2, quorum: 1.0, round_deadline_s: 120}
train: {local_steps: 3, batch_size: 16, lr: 0.05}
split: {mode: ushaped, cut: 1, record: 2}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=400", partition: iid, clients: 2}
)";
  ASSERT_EQ(Wait(Start({}, "run-u"), 300), 0) << Output();
  int records = 0;
  for (const auto& f : fs::recursive_directory_iterator(dir_ / "run-u" / "record")) {
    if (!f.is_regular_file()) continue;
    ++records;
    auto set = ParameterSet::Decode(ReadFile(f.path().string()).value_or(""));
    ASSERT_TRUE(set.ok()) << set.status();
    for (const char* name : {"act/0", "grad/0", "act/1", "grad/1"}) EXPECT_NE(set->Find(name), nullptr) << name;
    EXPECT_EQ(set->Find("labels/0"), nullptr) << "U-shaped: no label reached the server";
  }
  EXPECT_EQ(records, 2);
  ASSERT_NE(Wait(Spawn({"cleave", "attack", "tokens", (dir_ / "run-u").string()}, "u.txt"), 60), 0);
  EXPECT_NE(ReadFile((dir_ / "u.txt").string())->find("reads no tokens"), std::string::npos);
  // The gradients the server received give the labels away: scored against the
  // devices' own copies (cleave local keeps them with split.record).
  ASSERT_EQ(Wait(Spawn({"cleave", "attack", "labels", (dir_ / "run-u").string()}, "ul.txt"), 60), 0)
      << ReadFile((dir_ / "ul.txt").string()).value_or("");
  const std::string labels = ReadFile((dir_ / "ul.txt").string()).value_or("");
  EXPECT_NE(labels.find("(against the device's copy)"), std::string::npos) << labels;
  EXPECT_EQ(labels.find("the labels that crossed"), std::string::npos) << labels;
  EXPECT_GT(Number(labels, "total: %*d examples: direction AUC %*f, accuracy %lf"), 60) << labels;
}

// Reconstruction at LeNet-5's first cut from a real run's record, scored against the
// devices' copies: recognisable images (SSIM well above what guessing the mean image
// scores, about 0.12), a PNG grid of them; and the labels from the gradients the server
// sent.
TEST_F(LocalTest, ACuriousServerReconstructsImagesAtTheFirstCut) {
  std::ofstream(config_) << R"(
run: {name: att-img, rounds: 1, seed: 1}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 200}
clients: {min: 2, quorum: 1.0, round_deadline_s: 120}
train: {local_steps: 3, batch_size: 16, lr: 0.05}
split: {mode: sfl-v2, cut: 1, record: 1}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=400", partition: iid, clients: 2}
)";
  ASSERT_EQ(Wait(Start({}, "run"), 300), 0) << Output();
  const std::string grid = (dir_ / "grid.png").string();
  ASSERT_EQ(Wait(Spawn({"cleave", "attack", "images", (dir_ / "run").string(), "--aux-limit", "1000", "--steps", "300",
                        "--optimise-steps", "100", "--grid", grid},
                       "images.txt"),
                 120),
            0)
      << ReadFile((dir_ / "images.txt").string()).value_or("");
  const std::string out = ReadFile((dir_ / "images.txt").string()).value_or("");
  EXPECT_GT(Number(out, "total: 32 images; learned SSIM %lf"), 0.4) << out;
  EXPECT_GT(Number(out, "total: 32 images; learned SSIM %*f PSNR %*f dB; optimised SSIM %lf"), 0.4) << out;
  // Three rows (the inputs, learned, optimised) of eight 28 x 28 images, each three times
  // its size with 2-pixel gaps.
  const std::string png = ReadFile(grid).value_or("");
  ASSERT_GE(png.size(), 24u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  auto be32 = [&](size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<uint8_t>(png[at + i]);
    return v;
  };
  EXPECT_EQ(be32(16), 8u * (3 * 28 + 2) + 2);
  EXPECT_EQ(be32(20), 3u * (3 * 28 + 2) + 2);
  ASSERT_EQ(Wait(Spawn({"cleave", "attack", "labels", (dir_ / "run").string()}, "labels.txt"), 60), 0);
  const std::string labels = ReadFile((dir_ / "labels.txt").string()).value_or("");
  EXPECT_NE(labels.find("the labels that crossed: 100.0 % true"), std::string::npos) << labels;
  EXPECT_GT(Number(labels, "total: %*d examples: direction AUC %lf"), 0.7) << labels;
}

// Federated rounds: a curious server that keeps single updates (server.record_updates)
// reads each one's labels off it and inverts its images (DLG/iDLG) from one SGD step on a
// batch of two; under secure aggregation it never holds one to record.
TEST_F(LocalTest, ACuriousServerInvertsSingleUpdatesButNotUnderSecureAggregation) {
  const auto config = [&](int clients, const char* extra) {
    std::ofstream(config_) << "run: {name: dlg, rounds: 1, seed: 1}\nmodel: {name: lenet5}\n"
                           << "data: {test: \"fmnist:/usr/share/datasets/fashion-mnist\", test_limit: 200}\n"
                           << "clients: {min: " << clients << ", quorum: 1.0, round_deadline_s: 120}\n"
                           << "train: {local_steps: 1, batch_size: 2, lr: 0.1}\nserver: {record_updates: 2}\n" << extra
                           << "local: {data: \"fmnist:/usr/share/datasets/fashion-mnist,limit=600\", partition: iid, "
                           << "clients: " << clients << "}\n";
  };
  config(2, "");
  ASSERT_EQ(Wait(Start({}, "run"), 300), 0) << Output();
  ASSERT_EQ(Wait(Spawn({"cleave", "attack", "updates", (dir_ / "run").string(), "--steps", "1000"}, "dlg.txt"), 120), 0)
      << ReadFile((dir_ / "dlg.txt").string()).value_or("");
  const std::string out = ReadFile((dir_ / "dlg.txt").string()).value_or("");
  EXPECT_NE(out.find("total: 4 of 4 labels right; 4 images"), std::string::npos) << out;
  EXPECT_GT(Number(out, "total: %*d of %*d labels right; %*d images; reconstructed SSIM %lf"), 0.25) << out;

  config(6, "secure_aggregation: {}\n");
  ASSERT_EQ(Wait(Start({}, "run-secagg"), 300), 0) << Output();
  ASSERT_EQ(Wait(Spawn({"cleave", "attack", "updates", (dir_ / "run-secagg").string()}, "secagg.txt"), 60), 2);
  EXPECT_NE(ReadFile((dir_ / "secagg.txt").string())->find("under secure aggregation the server never holds"),
            std::string::npos);
}

// split.max_reconstruction_ssim: the server measures its own reconstruction attack at
// every cut of LeNet-5 before the first round and cuts each device only where that
// stays under the floor (here the first cut, the one that leaks most, is out).
TEST_F(LocalTest, APrivacyFloorCutsWhereTheServersAttackStaysUnderIt) {
  std::ofstream(config_) << R"(
run: {name: floor, rounds: 1, seed: 1}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 200}
clients: {min: 2, quorum: 1.0, round_deadline_s: 120}
train: {local_steps: 3, batch_size: 16, lr: 0.05}
split: {mode: sfl-v2, cut: auto, max_reconstruction_ssim: 0.6}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=400", partition: iid, clients: 2}
)";
  ASSERT_EQ(Wait(Start({}, "run"), 300), 0) << Output();
  const std::string log = ReadFile((dir_ / "run" / "server.log").string()).value_or("");
  std::vector<double> ssim = {-1};  // by cut
  for (int cut = 1; cut <= 4; ++cut) {
    ssim.push_back(Number(log, absl::StrCat("cut ", cut, ": %lf")));
    ASSERT_FALSE(std::isnan(ssim.back())) << log;
  }
  EXPECT_GT(ssim[1], 0.6) << "the first cut leaks the most: above the floor";
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_EQ(rows[0]["cuts"].size(), 2u) << rows[0];
  for (const auto& [name, cut] : rows[0]["cuts"].items()) {
    ASSERT_GE(cut.get<int>(), 1);
    ASSERT_LE(cut.get<int>(), 4);
    EXPECT_LE(ssim[cut.get<int>()], 0.6) << name << " at cut " << cut;
  }
  EXPECT_NE(log.find("under split.max_reconstruction_ssim 0.6"), std::string::npos) << log;
}

// A red-team server (split.hijack: fsha) hijacks training; every device's SplitGuard
// (local.split_guard) catches it and refuses the server, which then has no results and
// ends the run. The same devices with an honest server train on: the guard scores it
// high and the federation learns. The hijacked run may last 12 rounds: a guard decides
// after 10 scored fakes, one micro-batch in 20 or so after a warm-up, and a round is 94
// micro-batches; it ends at the refusals (about round 3). A device may refuse a round
// before the other: the hijacked run's quorum of one keeps the rounds going (with the
// other device) until both have refused, rather than end the run before the second's
// verdict.
TEST_F(LocalTest, DevicesGuardsRefuseAHijackingServerAndNotAnHonestOne) {
  const std::string job = R"(
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 500}
train: {local_epochs: 1, batch_size: 32, lr: 0.05}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=6000", partition: iid, clients: 2, split_guard: true}
)";
  std::ofstream(config_) << "run: {name: guard, rounds: 12, seed: 1}" << job
                         << "clients: {min: 2, quorum: 0.5, round_deadline_s: 120}\n"
                         << "split: {mode: sfl-v2, cut: 1, hijack: fsha, record: 2}\n";
  EXPECT_NE(Wait(Start({}, "hijacked"), 300), 0) << "no results: the run fails";
  // What the hijack read before the refusal, scored against the devices' copies.
  ASSERT_EQ(Wait(Spawn({"cleave", "attack", "hijack", (dir_ / "hijacked").string()}, "hijack.txt"), 60), 0)
      << ReadFile((dir_ / "hijack.txt").string()).value_or("");
  const std::string scored = ReadFile((dir_ / "hijack.txt").string()).value_or("");
  EXPECT_GE(Number(scored, "round 1: %lf images; hijack SSIM"), 128) << "2 devices x 2 micro-batches of 32\n" << scored;
  EXPECT_TRUE(fs::exists(dir_ / "hijacked" / "attack" / "hijack.json"));
  for (const char* client : {"client-0.log", "client-1.log"}) {
    const std::string log = ReadFile((dir_ / "hijacked" / client).string()).value_or("");
    EXPECT_NE(log.find("training hijacking suspected"), std::string::npos) << client << ":\n" << log;
  }
  const std::string server = ReadFile((dir_ / "hijacked" / "server.log").string()).value_or("");
  EXPECT_NE(server.find("rejected by the client: SplitGuard"), std::string::npos) << server;

  std::ofstream(config_) << "run: {name: guard, rounds: 3, seed: 1}" << job
                         << "clients: {min: 2, quorum: 1.0, round_deadline_s: 120}\n"
                         << "split: {mode: sfl-v2, cut: 1}\n";
  ASSERT_EQ(Wait(Start({}, "honest"), 300), 0) << Output();
  for (const char* client : {"client-0.log", "client-1.log"}) {
    const std::string log = ReadFile((dir_ / "honest" / client).string()).value_or("");
    EXPECT_EQ(log.find("training hijacking suspected"), std::string::npos) << client << ":\n" << log;
    const size_t last = log.rfind("SplitGuard: mean score");  // after the last round
    ASSERT_NE(last, std::string::npos) << log;
    EXPECT_GT(Number(log.substr(last), "SplitGuard: mean score %lf"), 0.6) << "its threshold\n" << log;
  }
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "honest");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_GT(rows[2]["test_accuracy"].get<double>(), 0.3) << "it learns (0.1 at the start)";
}

// Pipelines in one process: chains of virtual clients, micro-batches going peer to peer
// over loopback (each serving Peer on a port of its own), the last device of each chain
// streaming to the in-process server.
TEST_F(LocalTest, SimulatesPipelines) {
  std::ofstream(config_) << R"(
run: {name: sim-pipeline, rounds: 2, seed: 3}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 1000}
clients: {min: 6, quorum: 1.0, round_deadline_s: 120}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
split: {mode: pipeline, cut: 3, devices: 3, micro_batches: 4}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=3000", partition: iid, clients: 6}
)";
  pid_t pid = Spawn({"cleave", "simulate", "--config", config_, "--run-dir", (dir_ / "run").string()});
  ASSERT_EQ(Wait(pid, 300), 0) << Output();
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) {
    EXPECT_EQ(row["participants"], 6) << row;
    ASSERT_EQ(row["pipeline"].size(), 2u) << row;
    for (const auto& chain : row["pipeline"]) {
      EXPECT_TRUE(chain["done"].get<bool>()) << chain;
      EXPECT_EQ(chain["bounds"], nlohmann::json({0, 1, 2, 3})) << chain;
    }
  }
  EXPECT_GT(rows[1]["test_accuracy"].get<double>(), 0.3) << "it learns (0.1 at the start)";
}

// A device trace decides who is online: here every odd client never is, so rounds only
// ever sample the even ones. `cleave trace` writes traces that read back.
TEST_F(LocalTest, ASimulationFollowsItsDeviceTrace) {
  const std::string trace = (dir_ / "trace.csv").string();
  std::ofstream(trace) << "client,slowdown,uplink_mbps,downlink_mbps,online\n"
                          "0,1,0,0,\n"
                          "1,1,0,0,none\n";
  std::ofstream(config_) << R"(
run: {name: sim, rounds: 2, seed: 3}
model: {name: mlp}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 500}
clients: {min: 20, per_round: 20, quorum: 1.0, round_deadline_s: 120}
train: {local_epochs: 1, batch_size: 10, lr: 0.1}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=2000", partition: iid, clients: 40,
        trace: )" << trace << "}\n";
  pid_t pid = Spawn({"cleave", "simulate", "--config", config_, "--run-dir", (dir_ / "run").string()});
  ASSERT_EQ(Wait(pid, 300), 0) << Output();
  const std::string out = Output();
  EXPECT_NE(out.find("(20 online at start)"), std::string::npos) << out;
  EXPECT_NE(out.find("trace: 0 dropouts, 0 returns"), std::string::npos) << out;
  std::ifstream metrics(dir_ / "run" / "metrics.jsonl");
  int rounds = 0;
  for (std::string line; std::getline(metrics, line); ++rounds) {
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["participants"], 20);
    EXPECT_EQ(j["failures"], 0);
  }
  EXPECT_EQ(rounds, 2);
  const auto log = ReadFile((dir_ / "run" / "simulate.log").string());
  ASSERT_TRUE(log.ok());
  EXPECT_NE(log->find("(sim-0) joined"), std::string::npos);
  EXPECT_EQ(log->find("(sim-1) joined"), std::string::npos) << "an offline client joined";

  const std::string generated = (dir_ / "gen.csv").string();
  pid = Spawn({"cleave", "trace", "--clients", "5", "--out", generated, "--online", "0.5",
               "--speed-spread", "10", "--uplink-mbps", "1:20", "--seed", "3"},
              "trace.txt");
  ASSERT_EQ(Wait(pid, 60), 0) << ReadFile((dir_ / "trace.txt").string()).value_or("");
  auto text = ReadFile(generated);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(std::count(text->begin(), text->end(), '\n'), 6) << *text;
  pid = Spawn({"cleave", "trace", "--clients", "5", "--out", generated, "--uplink-mbps", "3"},
              "trace2.txt");
  EXPECT_EQ(Wait(pid, 60), 2);
  EXPECT_NE(ReadFile((dir_ / "trace2.txt").string())->find("--uplink-mbps wants MIN:MAX"),
            std::string::npos);
}

// cleave local follows a device trace too: a client that is never online is never
// started, the others get their line's emulation flags.
TEST_F(LocalTest, LocalFederationFollowsItsDeviceTrace) {
  const std::string trace = (dir_ / "trace.csv").string();
  std::ofstream(trace) << "client,slowdown,uplink_mbps,downlink_mbps,online\n"
                          "0,1,0,0,\n"
                          "1,1.5,80,90,\n"
                          "2,1,0,0,none\n";
  std::ofstream(config_) << R"(
run: {name: e2e, rounds: 2}
model: {name: mlp}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 2000}
clients: {min: 2, quorum: 1.0, round_deadline_s: 60}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=6000", partition: iid, clients: 3,
        trace: )" << trace << "}\n";
  pid_t pid = Start({"--insecure"});
  ASSERT_EQ(Wait(pid, 300), 0) << Output();
  std::ifstream metrics(dir_ / "run" / "metrics.jsonl");
  int rounds = 0;
  for (std::string line; std::getline(metrics, line); ++rounds) {
    EXPECT_EQ(nlohmann::json::parse(line)["participants"], 2);
  }
  EXPECT_EQ(rounds, 2);
  EXPECT_TRUE(fs::exists(dir_ / "run" / "client-1.log"));
  EXPECT_FALSE(fs::exists(dir_ / "run" / "client-2.log")) << "an offline client was started";
  const auto log1 = ReadFile((dir_ / "run" / "client-1.log").string());
  ASSERT_TRUE(log1.ok());
  EXPECT_NE(log1->find("emulating a device: compute slowdown 1.5x, uplink 80 Mbit/s, downlink 90"),
            std::string::npos)
      << *log1;
}

// A Hugging Face folder with no job config (the Llama folder tests/models/
// llama_reference.py writes): `cleave generate` and `cleave evaluate` take it as the
// checkpoint, and `cleave export` writes a folder of its own that evaluates the same.
TEST_F(LocalTest, AHuggingFaceFolderIsSampledEvaluatedAndExported) {
  const std::string folder = (dir_ / "llama").string(), out = (dir_ / "exported").string();
  ASSERT_EQ(std::system((std::string("/usr/bin/python3 ") + CLEAVE_SOURCE_DIR +
                         "/tests/models/llama_reference.py make " + folder + " bytes BF16 2 9").c_str()),
            0);
  auto command = [&](std::vector<std::string> argv, const std::string& name) {
    EXPECT_EQ(Wait(Spawn(argv, name), 120), 0) << ReadFile((dir_ / name).string()).value_or("");
    return ReadFile((dir_ / name).string()).value_or("");
  };
  const std::vector<std::string> gen = {"cleave", "generate", "--checkpoint", folder, "--tokenizer", "byte",
                                        "--prompt", "The ", "--tokens", "12", "--seed", "4"};
  const std::string a = command(gen, "gen1.txt");
  EXPECT_EQ(a, command(gen, "gen2.txt"));
  EXPECT_EQ(a.rfind("The ", 0), 0u) << a;
  const std::string data = "text:/usr/share/games/fortunes/pets,context=32";
  auto all_row = [](const std::string& t) {
    const size_t at = t.find("| all | ");
    return at == std::string::npos ? std::string() : t.substr(at, t.find('\n', at) - at);
  };
  const std::string table = all_row(command({"cleave", "evaluate", "--checkpoint", folder, "--data", data}, "eval.txt"));
  ASSERT_FALSE(table.empty());
  EXPECT_NE(command({"cleave", "export", "--checkpoint", folder, "--out", out}, "export.txt").find("config.json"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(out + "/model.safetensors") && fs::exists(out + "/config.json"));
  EXPECT_EQ(all_row(command({"cleave", "evaluate", "--checkpoint", out, "--data", data}, "eval2.txt")), table);
  // Without a tokenizer in the folder and none given, generate says what is missing.
  EXPECT_EQ(Wait(Spawn({"cleave", "generate", "--checkpoint", folder, "--prompt", "x"}, "bad.txt"), 60), 2);
  EXPECT_NE(ReadFile((dir_ / "bad.txt").string())->find("tokenizer.json"), std::string::npos);
}

// A language model from `cleave local` to what a user does with it: perplexity per
// client (`cleave evaluate --by client:2`), sampling (`cleave generate`: the same seed,
// the same text), and an export to GPT-2-layout safetensors that evaluates exactly like
// the checkpoint it came from.
TEST_F(LocalTest, ALanguageModelRunIsEvaluatedSampledAndExported) {
  fs::create_directories(dir_ / "text");
  fs::create_symlink("/usr/share/games/fortunes/pets", dir_ / "text" / "pets");
  fs::create_symlink("/usr/share/games/fortunes/wisdom", dir_ / "text" / "wisdom");
  const std::string text = "text:" + (dir_ / "text").string() + ",context=32";
  std::ofstream(config_) << "run: {name: lm, rounds: 1}\n"
                            "model: {name: gpt, gpt: {vocab: 256, context: 32, layers: 1, heads: 2, dim: 32}}\n"
                            "data: {test: \"" << text << "\"}\n"
                            "clients: {min: 2, quorum: 1.0, round_deadline_s: 120}\n"
                            "train: {optimizer: adamw, lr: 0.005, local_steps: 30, batch_size: 16}\n"
                            "local: {data: \"" << text << "\", partition: natural, clients: 2}\n";
  ASSERT_EQ(Wait(Start({"--insecure"}), 300), 0) << Output();
  const std::string run = (dir_ / "run").string();
  auto command = [&](std::vector<std::string> argv, const std::string& out) {
    EXPECT_EQ(Wait(Spawn(argv, out), 120), 0) << ReadFile((dir_ / out).string()).value_or("");
    return ReadFile((dir_ / out).string()).value_or("");
  };
  // The table: the whole test set, then each client with its file.
  const std::string table = command({"cleave", "evaluate", run, "--by", "client:2"}, "eval.txt");
  EXPECT_NE(table.find("| client | examples | loss | accuracy | bits_per_byte | perplexity |"),
            std::string::npos) << table;
  EXPECT_NE(table.find("| client-0 (pets) | "), std::string::npos) << table;
  EXPECT_NE(table.find("| client-1 (wisdom) | "), std::string::npos) << table;
  auto all_row = [](const std::string& t) {
    const size_t at = t.find("| all | ");
    return at == std::string::npos ? std::string() : t.substr(at, t.find('\n', at) - at);
  };
  const std::string all = all_row(table);
  ASSERT_FALSE(all.empty()) << table;
  const double perplexity = std::stod(all.substr(all.rfind("| ", all.size() - 3) + 2));
  EXPECT_LT(perplexity, 40) << "one round learns English's bytes, from 256";

  const std::vector<std::string> gen = {"cleave", "generate", run, "--prompt", "The ",
                                        "--tokens", "40", "--seed", "3"};
  const std::string a = command(gen, "gen1.txt"), b = command(gen, "gen2.txt");
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.rfind("The ", 0), 0u) << a;
  EXPECT_GT(a.size(), 20u) << a;

  const std::string file = (dir_ / "model.safetensors").string();
  EXPECT_NE(command({"cleave", "export", run, "--out", file}, "export.txt").find("GPT-2's layout"),
            std::string::npos);
  const std::string again = command({"cleave", "evaluate", "--config", run + "/config.yaml",
                                     "--checkpoint", file, "--by", "client:2"}, "eval2.txt");
  EXPECT_EQ(all_row(again), all);

  // Bad requests are clear errors.
  EXPECT_EQ(Wait(Spawn({"cleave", "evaluate", run, "--by", "file"}, "bad.txt"), 60), 2);
  EXPECT_NE(ReadFile((dir_ / "bad.txt").string())->find("--by is group or client:N"), std::string::npos);
  EXPECT_EQ(Wait(Spawn({"cleave", "evaluate", run, "--data", "fmnist:/usr/share/datasets/fashion-mnist"},
                       "bad2.txt"), 60), 2);
  EXPECT_NE(ReadFile((dir_ / "bad2.txt").string())->find("fmnist"), std::string::npos)
      << ReadFile((dir_ / "bad2.txt").string()).value_or("");
}

// Same config, same seeds: the same federation (up to float summation order, since
// updates are folded in as they arrive).
// A coordinator without data: a real table (sklearn's breast cancer, shipped by Debian)
// split among three clients by Dirichlet, standardised on each client, evaluated only by
// the clients on the data they hold out (federated evaluation).
TEST_F(LocalTest, TabularFederationWithFederatedEvaluation) {
  std::ofstream(config_) << R"(
run: {name: table, rounds: 4, seed: 1}
model: {name: mlp, input: [30], classes: 1}
data: {test: ""}
clients: {min: 3, quorum: 1.0, round_deadline_s: 60}
train: {loss: bce, local_epochs: 5, batch_size: 16, lr: 0.02, momentum: 0.9}
local:
  data: "csv:/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv,header=0,skip=1,standardise"
  partition: "dirichlet:1.0"
  clients: 3
  holdout: 0.25
)";
  ASSERT_EQ(Wait(Start({}), 300), 0) << Output();
  EXPECT_NE(Output().find("client acc"), std::string::npos) << Output();
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_EQ(rows.size(), 5u);  // four rounds, then the clients' evaluation of the final model
  EXPECT_NE(Output().find("final model  client acc"), std::string::npos) << Output();
  for (const auto& row : rows) {
    EXPECT_FALSE(row.contains("test_accuracy")) << "the server holds no test set";
    ASSERT_TRUE(row.contains("client_eval")) << row;
    const auto& e = row["client_eval"];
    EXPECT_EQ(e["clients"], 3);
    EXPECT_NEAR(e["examples"].get<double>(), 0.25 * 569, 3);  // every client's hold-out
    EXPECT_LE(e["accuracy_min"].get<double>(), e["accuracy_median"].get<double>());
    EXPECT_LE(e["accuracy_median"].get<double>(), e["accuracy_max"].get<double>());
    EXPECT_LE(e["loss_min"].get<double>(), e["loss"].get<double>());
    EXPECT_LE(e["loss_median"].get<double>(), e["loss_max"].get<double>());
    EXPECT_GE(e["loss_max"].get<double>(), e["loss"].get<double>());
    EXPECT_EQ(e.contains("train_seconds"), !row.value("evaluation_only", false));
    for (const char* k : {"precision", "recall", "f1"}) {  // binary metrics, weighted means
      ASSERT_TRUE(e.contains(k)) << e;
      EXPECT_GE(e[k].get<double>(), 0);
      EXPECT_LE(e[k].get<double>(), 1);
    }
  }
  // Round 1 measures the initial model; by round 4 the federation has learned (the
  // majority class is 63 % of the table). The last line is the final model's.
  EXPECT_EQ(rows.back()["round"], 4);
  EXPECT_TRUE(rows.back().value("evaluation_only", false)) << rows.back();
  EXPECT_FALSE(rows.back().contains("train_loss"));
  const auto& last = rows.back()["client_eval"];
  EXPECT_GT(last["accuracy"].get<double>(), 0.85) << rows.back();
  EXPECT_GT(last["accuracy"].get<double>(), rows.front()["client_eval"]["accuracy"].get<double>());
  EXPECT_GT(last["f1"].get<double>(), 0.85) << rows.back();
}

// The regression example as shipped (Boston house prices, mse): the clients' RMSE on
// their held-out rows falls well below the targets' spread.
TEST_F(LocalTest, RegressionExampleReportsRmse) {
  config_ = std::string(CLEAVE_SOURCE_DIR) + "/deploy/examples/table-house-prices.yaml";
  ASSERT_EQ(Wait(Start({}), 300), 0) << Output();
  EXPECT_NE(Output().find("client rmse"), std::string::npos) << Output();
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_EQ(rows.size(), 21u);  // and the final evaluation
  const auto& first = rows.front()["client_eval"];
  const auto& last = rows.back()["client_eval"];
  for (const char* k : {"mae", "rmse"}) ASSERT_TRUE(last.contains(k)) << last;
  EXPECT_FALSE(last.contains("f1"));
  // MEDV's standard deviation is 9.2 (predicting its mean scores that); the initial
  // model predicts about 0 against a mean of 22.5.
  EXPECT_GT(first["rmse"].get<double>(), 15) << first;
  EXPECT_LT(last["rmse"].get<double>(), 4.5) << last;
  EXPECT_LE(last["mae"].get<double>(), last["rmse"].get<double>());
  // mse: the loss is the squared error, so the weighted mean of the clients' mean squared
  // errors bounds the square of the weighted RMSE from above (Jensen).
  EXPECT_GE(last["loss"].get<double>() + 1e-9, std::pow(last["rmse"].get<double>(), 2));
}

TEST_F(LocalTest, ASeededRunRepeatsItself) {
  std::vector<double> accuracy, loss;
  for (const char* dir : {"a", "b"}) {
    pid_t pid = Start({}, dir);
    ASSERT_EQ(Wait(pid, 300), 0) << Output();
    std::ifstream metrics(dir_ / dir / "metrics.jsonl");
    std::string line, last;
    while (std::getline(metrics, line)) last = line;
    auto j = nlohmann::json::parse(last);
    accuracy.push_back(j["test_accuracy"].get<double>());
    loss.push_back(j["test_loss"].get<double>());
    // Classification's other metrics: top-5 and per class, one entry per label.
    EXPECT_GE(j["test_top5_accuracy"].get<double>(), accuracy.back()) << j;
    ASSERT_EQ(j["test_per_class_accuracy"].size(), 10u) << j;
    double worst = 1;
    for (const auto& a : j["test_per_class_accuracy"]) worst = std::min(worst, a.get<double>());
    EXPECT_LT(worst, accuracy.back()) << "Fashion-MNIST's shirts trail the mean";
  }
  EXPECT_NEAR(accuracy[0], accuracy[1], 0.002);
  EXPECT_NEAR(loss[0], loss[1], 0.002);
}

TEST_F(LocalTest, CtrlCStopsEveryProcess) {
  pid_t pid = Start({"--rounds", "50"});
  // Wait for the first round to be printed, then interrupt.
  for (int i = 0; i < 600 && Output().find("round   1/50") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_NE(Output().find("round   1/50"), std::string::npos) << Output();
  auto addr = ReadFile((dir_ / "run" / "server.addr").string());
  ASSERT_TRUE(addr.ok());
  const std::string a = addr->substr(0, addr->size() - 1);
  EXPECT_EQ(ProcessesUsing(a), 5) << "cleave, the server and 3 clients";
  // `cleave status` reaches the running server, over TLS with the run's CA.
  const std::string status_cmd = std::string(CLEAVE_BIN_DIR) + "/cleave status --server " + a +
                                 " --ca " + (dir_ / "run" / "certs" / "ca.crt").string();
  FILE* p = popen(status_cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512] = {0};
  const size_t n = fread(buf, 1, sizeof(buf) - 1, p);
  EXPECT_EQ(pclose(p), 0);
  EXPECT_NE(std::string(buf, n).find("run e2e-"), std::string::npos) << buf;
  EXPECT_NE(std::string(buf, n).find("/50"), std::string::npos) << buf;
  kill(pid, SIGINT);
  EXPECT_EQ(Wait(pid, 30), 130) << Output();
  EXPECT_EQ(ProcessesUsing(a), 0);
}

TEST_F(LocalTest, ClientsThatCannotStartEndTheRunWithTheirError) {
  std::string text = *ReadFile(config_);
  text.replace(text.find("fashion-mnist,limit"), 13, "no-such-dir");
  std::ofstream(config_) << text;
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = Start({});
  EXPECT_EQ(Wait(pid, 60), 1) << Output();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30))
      << "must not wait for the server's join timeout";
  EXPECT_NE(Output().find("clients failed"), std::string::npos) << Output();
  EXPECT_NE(Output().find("no-such-dir"), std::string::npos) << Output();
}

// The daemons stop cleanly on SIGTERM, whichever of their threads the signal hits.
// (With JSON-lines logs: every line of server.log is a JSON object.)
TEST_F(LocalTest, ServerAndClientStopOnSigterm) {
  const std::string run = (dir_ / "srv").string();
  pid_t server = Spawn({"cleave-server", "--config", config_, "--run-dir", run, "--listen",
                        "127.0.0.1:0", "--insecure", "--log-format", "json"});
  for (int i = 0; i < 300 && !fs::exists(run + "/server.addr"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(fs::exists(run + "/server.addr")) << Output();
  kill(server, SIGTERM);
  EXPECT_EQ(Wait(server, 20), 130) << Output();
  std::istringstream log(*ReadFile(run + "/server.log"));
  int lines = 0, stopping = 0;
  for (std::string line; std::getline(log, line); ++lines) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << line;
    EXPECT_EQ(j["logger"], "server");
    stopping += j["msg"].get<std::string>().find("stopping") != std::string::npos;
  }
  EXPECT_GT(lines, 1);
  EXPECT_GE(stopping, 1);

  // A client retrying an absent server.
  pid_t client = Spawn({"cleave-client", "--server", "127.0.0.1:1", "--insecure", "--data",
                        "fmnist:/usr/share/datasets/fashion-mnist,limit=100"});
  // Once it retries it has its signal handlers (a fixed wait raced a slow start).
  for (int i = 0; i < 300 && Output().find("reconnecting in") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_NE(Output().find("reconnecting in"), std::string::npos) << Output();
  kill(client, SIGTERM);
  EXPECT_EQ(Wait(client, 20), 130) << Output();
}

// Bad command-line values and an unwritable run directory end each binary with exit
// code 2 and a message, never with an uncaught exception.
TEST_F(LocalTest, BadArgumentsAreClearErrors) {
  auto expect = [&](std::vector<std::string> argv, const std::string& needle) {
    const std::string what = argv[0] + " " + argv.back();
    EXPECT_EQ(Wait(Spawn(argv), 60), 2) << what << ": " << Output();
    EXPECT_NE(Output().find(needle), std::string::npos) << what << ": " << Output();
  };
  const std::string run = (dir_ / "srv").string();
  const std::vector<std::string> server = {"cleave-server", "--config", config_, "--run-dir", run,
                                           "--insecure"};
  auto with = [](std::vector<std::string> argv, std::vector<std::string> more) {
    argv.insert(argv.end(), more.begin(), more.end());
    return argv;
  };
  expect(with(server, {"--torch-threads", "-3"}), "--torch-threads");
  expect(with(server, {"--log-level", "bogus"}), "--log-level");
  expect(with(server, {"--log-format", "xml"}), "--log-format");
  expect(with(server, {"--rounds", "0"}), "--rounds");
  expect(with(server, {"--rounds", "-4"}), "--rounds");
  expect({"cleave-client", "--server", "127.0.0.1:1", "--insecure", "--data", "fmnist:/x",
          "--torch-threads", "-3"},
         "--torch-threads");
  expect({"cleave", "local", "--config", config_, "--clients", "0"}, "--clients");
  // A run directory where the server cannot write its log (here: server.log is a
  // directory; a read-only mount fails the same way).
  fs::create_directories(dir_ / "srv" / "server.log");
  expect(server, "cannot open the log");
}

// TLS is the default: plaintext is refused unless asked for with --insecure.
TEST_F(LocalTest, PlaintextOnlyWithInsecure) {
  pid_t server = Spawn({"cleave-server", "--config", config_, "--run-dir",
                        (dir_ / "srv").string(), "--listen", "127.0.0.1:0"});
  EXPECT_EQ(Wait(server, 60), 1);
  EXPECT_NE(Output().find("TLS is required"), std::string::npos) << Output();
  pid_t client = Spawn({"cleave-client", "--server", "127.0.0.1:1", "--data",
                        "fmnist:/usr/share/datasets/fashion-mnist,limit=100"});
  EXPECT_EQ(Wait(client, 60), 2);
  EXPECT_NE(Output().find("--insecure"), std::string::npos) << Output();
  pid_t status = Spawn({"cleave", "status", "--server", "127.0.0.1:1"});
  EXPECT_EQ(Wait(status, 60), 2);
  EXPECT_NE(Output().find("--insecure"), std::string::npos) << Output();
}

// A bearer token (auth.token_file) through real binaries: cleave local hands it to its
// clients (--token-file, over TLS); a client without it is refused.
TEST_F(LocalTest, BearerTokenThroughRealProcesses) {
  const std::string token = (dir_ / "token").string();
  std::ofstream(token) << "an-example-bearer-token-0123\n";
  std::string text = *ReadFile(config_);
  text.replace(text.find("run: {name: e2e, rounds: 2}"), 27, "run: {name: e2e, rounds: 1}");
  std::ofstream(config_) << text << "auth: {token_file: " << token << "}\n";
  ASSERT_EQ(Wait(Start({}), 300), 0) << Output();
  EXPECT_NE(Output().find("done: 1 rounds"), std::string::npos) << Output();
  // Without the token, `cleave status` against a server of this job is refused.
  const std::string run = (dir_ / "srv").string();
  ASSERT_EQ(InitFederation((dir_ / "fed").string()), absl::OkStatus());
  pid_t server = Spawn({"cleave-server", "--config", config_, "--run-dir", run, "--listen",
                        "127.0.0.1:0", "--tls-cert", (dir_ / "fed" / "server.crt").string(),
                        "--tls-key", (dir_ / "fed" / "server.key").string()});
  for (int i = 0; i < 300 && !fs::exists(run + "/server.addr"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string addr = *ReadFile(run + "/server.addr");
  const std::string ca = (dir_ / "fed" / "ca.crt").string();
  pid_t refused = Spawn({"cleave", "status", "--server", addr.substr(0, addr.size() - 1), "--ca", ca});
  EXPECT_EQ(Wait(refused, 30), 1);
  EXPECT_NE(Output().find("bearer token"), std::string::npos) << Output();
  pid_t allowed = Spawn({"cleave", "status", "--server", addr.substr(0, addr.size() - 1), "--ca", ca,
                         "--token-file", token});
  EXPECT_EQ(Wait(allowed, 30), 0) << Output();
  kill(server, SIGTERM);
  Wait(server, 20);
}

// The issue's end-to-end check: mutual TLS and SecAgg+ through `cleave local`, against
// plain FedAvg on the same seeds.
TEST_F(LocalTest, MutualTlsAndSecureAggregationMatchPlainFedAvg) {
  const std::string base = R"(
run: {name: e2e-secagg, rounds: 4, seed: 5}
model: {name: mlp}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist"}
clients: {min: 5, quorum: 1.0, round_deadline_s: 60}
train: {local_epochs: 1, batch_size: 32, lr: 0.02, momentum: 0.9}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=10000", partition: iid, clients: 5}
tls: {mutual: true}
)";
  auto final_accuracy = [&](const std::string& run) {
    std::ifstream metrics(dir_ / run / "metrics.jsonl");
    nlohmann::json last;
    for (std::string line; std::getline(metrics, line);) last = nlohmann::json::parse(line);
    return last.value("test_accuracy", 0.0);
  };
  std::ofstream(config_) << base
                         << "secure_aggregation: {k: 4, t: 3, clip: 1.0, bits: 16}\n";
  ASSERT_EQ(Wait(Start({}, "secure"), 300), 0) << Output();
  EXPECT_NE(Output().find(", mutual TLS"), std::string::npos) << Output();
  EXPECT_TRUE(fs::exists(dir_ / "secure" / "certs" / "clients" / "client-4.crt"));
  const std::string log = *ReadFile((dir_ / "secure" / "server.log").string());
  EXPECT_NE(log.find("unmasked the sum of 5 updates"), std::string::npos) << log;
  EXPECT_NE(log.find("(client-3) joined"), std::string::npos) << "named by its certificate";
  std::ofstream(config_) << base;
  ASSERT_EQ(Wait(Start({}, "plain"), 300), 0) << Output();
  const double secure = final_accuracy("secure"), plain = final_accuracy("plain");
  EXPECT_GT(plain, 0.6);
  EXPECT_NEAR(secure, plain, 0.01);
}

// Decentralised rounds as cleave local runs them: every client serves Peer on its own
// port over mutual TLS with the certificate cleave local issued it, sends its model to
// its neighbours (verified as NAME.peer.cleave) and averages; the clients' held-out
// accuracy rises, every neighbour is heard, and no trained model reaches the server.
TEST_F(LocalTest, GossipRoundsPeerToPeerOverMutualTls) {
  std::ofstream(config_) << R"(
run: {name: e2e-gossip, rounds: 3, seed: 5}
model: {name: mlp}
data: {test: ""}
server: {evaluate: false}
clients: {min: 4, quorum: 1.0, round_deadline_s: 60}
scheduler: {mode: gossip, topology: random, degree: 2}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
local: {data: "fmnist:/usr/share/datasets/fashion-mnist,limit=4000", partition: iid, clients: 4,
        holdout: 0.2}
tls: {mutual: true}
)";
  ASSERT_EQ(Wait(Start({}), 300), 0) << Output();
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_EQ(rows.size(), 3u);
  for (const auto& row : rows) {
    ASSERT_TRUE(row.contains("gossip")) << row;
    EXPECT_EQ(row["gossip"]["heard"], row["gossip"]["neighbours"]) << row;
    EXPECT_GT(row["gossip"]["neighbours"].get<int>(), 0) << row;
    EXPECT_LT(row["update_bytes"].get<int64_t>(), 100) << "empty reports, no models";
  }
  EXPECT_GT(rows[2]["client_eval"]["accuracy"].get<double>(),
            rows[0]["client_eval"]["accuracy"].get<double>() + 0.2);
  const std::string log = *ReadFile((dir_ / "run" / "client-0.log").string());
  EXPECT_NE(log.find("serving Peer on 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("averaged with 2 of 2 neighbours"), std::string::npos) << log;
}

TEST_F(LocalTest, BadConfigIsAClearError) {
  std::ofstream(config_) << "train: {lr: -1}\n";
  pid_t pid = Start({});
  EXPECT_EQ(Wait(pid, 30), 2);
  EXPECT_NE(Output().find("train.lr must be > 0"), std::string::npos) << Output();
}

}  // namespace
}  // namespace cleave

namespace cleave {
namespace {

// Split learning through `cleave local`, with emulated devices: U-shaped (no label
// reaches the server), cuts chosen per device. The fast device on a slow link is cut
// deeper than the slow device on a fast link.
TEST_F(LocalTest, UShapedSplitLearningWithEmulatedDevices) {
  std::ofstream(config_) << R"(
run: {name: e2e-split, rounds: 2}
model: {name: vgg}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 1000}
clients: {min: 2, quorum: 1.0, round_deadline_s: 120}
train: {local_epochs: 1, batch_size: 16, lr: 0.05, momentum: 0.5}
split: {mode: ushaped, cut: auto, window: 2}
local:
  data: "fmnist:/usr/share/datasets/fashion-mnist,limit=1200"
  partition: iid
  clients: 2
  profiles:
    - {uplink_mbps: 2, downlink_mbps: 8}
    - {slowdown: 30}
)";
  pid_t pid = Start({});
  ASSERT_EQ(Wait(pid, 300), 0) << Output();
  EXPECT_NE(Output().find("split ushaped"), std::string::npos) << Output();
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) {
    EXPECT_EQ(r["participants"], 2);
    EXPECT_EQ(r["labels_up"], 0);
    EXPECT_GT(r["activation_bytes_up"].get<int64_t>(), 0);
    EXPECT_GT(r["step_s"].get<double>(), 0);
    EXPECT_GT(r["cuts"]["client-0"].get<int>(), r["cuts"]["client-1"].get<int>()) << r.dump();
  }
  // Learning, slowly (vgg from scratch, 38 steps a round; accuracy is tested with LeNet-5
  // in split_integration_test): the training loss falls.
  EXPECT_LT(rows[1]["train_loss"].get<double>(), rows[0]["train_loss"].get<double>())
      << rows[0].dump() << "\n" << rows[1].dump();
  auto log = ReadFile((dir_ / "run" / "server.log").string());
  ASSERT_TRUE(log.ok());
  EXPECT_NE(log->find("by cost-model: predicted step"), std::string::npos);
  EXPECT_NE(log->find("measured"), std::string::npos);
}

// A pipeline of three processes over mutual TLS: `cleave local` gives each client a
// Peer port, the planner places LeNet-5's first three stages over a chain of three
// devices from their profiles (memory limits declared), activations and gradients go
// device to device under the devices' certificates, the chain learns, and the report
// draws its timeline.
TEST_F(LocalTest, APipelineOfThreeProcessesOverMutualTls) {
  std::ofstream(config_) << R"(
run: {name: e2e-pipeline, rounds: 2}
model: {name: lenet5}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 1000}
clients: {min: 3, quorum: 1.0, round_deadline_s: 120}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
split: {mode: pipeline, cut: 3, devices: 3, micro_batches: 4, schedule: gpipe}
tls: {mutual: true}
local:
  data: "fmnist:/usr/share/datasets/fashion-mnist,limit=3000"
  partition: iid
  clients: 3
  profiles:
    - {slowdown: 2, memory_limit_mb: 400}
)";
  pid_t pid = Start({});
  ASSERT_EQ(Wait(pid, 300), 0) << Output();
  const std::vector<nlohmann::json> rows = testing::MetricsRows(dir_ / "run");
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) {
    EXPECT_EQ(r["participants"], 3) << r.dump();
    ASSERT_EQ(r["pipeline"].size(), 1u) << r.dump();
    const auto& chain = r["pipeline"][0];
    EXPECT_TRUE(chain["done"].get<bool>()) << r.dump();
    EXPECT_EQ(chain["devices"].size(), chain["busy"].size());
    EXPECT_EQ(chain["devices"].size(), 3u) << r.dump();
    EXPECT_EQ(chain["bounds"], nlohmann::json({0, 1, 2, 3})) << r.dump();
    EXPECT_GT(chain["spans"].size(), 0u);
  }
  EXPECT_LT(rows[1]["test_loss"].get<double>(), rows[0]["test_loss"].get<double>());
  EXPECT_GT(rows[1]["test_accuracy"].get<double>(), 0.4);
  auto log = ReadFile((dir_ / "run" / "server.log").string());
  ASSERT_TRUE(log.ok());
  EXPECT_NE(log->find("planned: predicted step"), std::string::npos) << *log;
  auto report = ReadFile((dir_ / "run" / "report.html").string());
  ASSERT_TRUE(report.ok());
  EXPECT_NE(report->find("pipeline chain 0"), std::string::npos);
}

// The rounds metrics.jsonl of run directory `run` records, in order.
std::vector<int> RecordedRounds(const fs::path& run) {
  std::vector<int> rounds;
  std::ifstream metrics(run / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    rounds.push_back(nlohmann::json::parse(line)["round"].get<int>());
  }
  return rounds;
}

// `n` TCP connections to the server at "127.0.0.1:PORT" that never send a byte, added to
// `idle` (the caller closes them).
void OpenIdleConnections(const std::string& addr, int n, std::vector<int>* idle) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(addr.rfind(':') + 1))));
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  for (int i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    idle->push_back(fd);
  }
}

// Starts a server on `yaml` with `max_fds` descriptors, lets `attack` open idle
// connections to it (`attack` gets its address and pid), then two honest clients: the
// run must complete with rounds 1..`rounds` recorded.
void LocalTest::ExpectRunSurvivesIdleConnections(
    const std::string& yaml, rlim_t max_fds, int rounds,
    const std::function<void(const std::string&, pid_t, std::vector<int>*)>& attack) {
  std::ofstream(config_) << yaml;
  const fs::path run = dir_ / "srv";
  pid_t server = Spawn({"cleave-server", "--config", config_, "--run-dir", run.string(), "--listen",
                        "127.0.0.1:0", "--insecure"},
                       "server.txt", max_fds);
  const std::string addr = testing::WaitForAddress(run);
  ASSERT_FALSE(addr.empty()) << ReadFile((dir_ / "server.txt").string()).value_or("");
  std::vector<int> idle;  // kept open on this side until the end
  attack(addr, server, &idle);
  std::vector<pid_t> clients;
  for (int i = 0; i < 2; ++i) {
    clients.push_back(Spawn({"cleave-client", "--server", addr, "--insecure", "--data",
                             "fmnist:/usr/share/datasets/fashion-mnist,limit=1000", "--partition",
                             "iid,client=" + std::to_string(i) + ",of=2", "--give-up-after", "90"},
                            "client" + std::to_string(i) + ".txt"));
  }
  const int rc = Wait(server, 150);
  for (int fd : idle) close(fd);
  for (pid_t c : clients) Wait(c, 30);
  const std::string log = ReadFile((run / "server.log").string()).value_or("");
  ASSERT_EQ(rc, 0) << log;
  std::vector<int> expected(rounds);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(RecordedRounds(run), expected) << log;
}

// Waves of connections that never send the HTTP/2 preface, more in all than the
// server's 512 descriptors, arrive before any authentication: the handshake timeout
// closes each wave before the next, so the server never runs out, the honest clients
// get in, and the run completes.
TEST_F(LocalTest, IdleConnectionsCannotExhaustTheServersDescriptors) {
  const auto waves = [](const std::string& addr, pid_t, std::vector<int>* idle) {
    for (int wave = 0; wave < 4; ++wave) {
      OpenIdleConnections(addr, 200, idle);
      std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    }
  };
  ExpectRunSurvivesIdleConnections(R"(
run: {name: e2e, rounds: 2}
model: {name: mlp}
server: {evaluate: false, handshake_timeout_s: 1}
clients: {min: 2, quorum: 1.0, round_deadline_s: 60, join_timeout_s: 60}
train: {batch_size: 32}
)",
                                   512, 2, waves);
}

// One burst of idle connections, more than the server's 256 descriptors, inside one
// handshake timeout. gRPC 1.51 alone stops accepting for good after the first accept that
// fails with EMFILE; the accept gate closes connections beyond server.max_connections
// (and any it has no descriptor for), so once the handshake timeout has closed the idle
// ones the honest clients get in and the run completes.
TEST_F(LocalTest, ABurstBeyondTheDescriptorLimitDoesNotStopAccepting) {
  const auto burst = [](const std::string& addr, pid_t server, std::vector<int>* idle) {
    OpenIdleConnections(addr, 400, idle);
    // Refused connections hold nothing: the burst costs the server little memory.
    std::ifstream status("/proc/" + std::to_string(server) + "/status");
    int64_t peak_kib = 0;
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmHWM:", 0) == 0) peak_kib = std::stoll(line.substr(6));
    }
    EXPECT_GT(peak_kib, 0);
    EXPECT_LT(peak_kib, 512 * 1024 * testing::kSanitizerMemory)
        << "peak RSS in KiB during the burst";
  };
  ExpectRunSurvivesIdleConnections(R"(
run: {name: e2e, rounds: 1}
model: {name: mlp}
server: {evaluate: false, handshake_timeout_s: 2}
clients: {min: 2, quorum: 1.0, round_deadline_s: 60, join_timeout_s: 90}
train: {batch_size: 32}
)",
                                   256, 1, burst);
}

// Chaos: clients killed and restarted, the server killed with SIGKILL and stopped with
// SIGTERM, each time restarted on its run directory. Clients under no supervisor keep
// reconnecting to a stopped server (only a finished run ends them), every round (or
// async version) is committed exactly once, and the checkpoint holds the last one.
void LocalTest::SurviveKillsAndRestarts(const std::string& scheduler) {
  std::ofstream(config_) << R"(
run: {name: chaos, rounds: 40}
model: {name: mlp}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 500}
clients: {min: 2, quorum: 1.0, round_deadline_s: 60, join_timeout_s: 120}
server: {heartbeat_s: 0.5, client_timeout_s: 3}
train: {batch_size: 32}
)" << scheduler;
  const fs::path run = dir_ / "srv";
  auto start_server = [&](const std::string& listen, int n) {
    return Spawn({"cleave-server", "--config", config_, "--run-dir", run.string(), "--listen",
                  listen, "--insecure"},
                 "server" + std::to_string(n) + ".txt");
  };
  pid_t server = start_server("127.0.0.1:0", 0);
  const std::string addr = testing::WaitForAddress(run);
  ASSERT_FALSE(addr.empty());
  fs::remove(run / "server.addr");
  int spawned = 0;
  auto start_client = [&](int i) {
    return Spawn({"cleave-client", "--server", addr, "--insecure", "--data",
                  "fmnist:/usr/share/datasets/fashion-mnist,limit=600", "--partition",
                  "iid,client=" + std::to_string(i) + ",of=2", "--give-up-after", "120"},
                 "client" + std::to_string(spawned++) + ".txt");
  };
  std::vector<pid_t> clients = {start_client(0), start_client(1)};
  auto wait_rounds = [&](size_t n) {
    // Polled often: a round takes tens of milliseconds, and each fault must strike while
    // the run is still going (40 rounds leave ample room after round 3).
    for (int i = 0; i < 12000 && RecordedRounds(run).size() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return RecordedRounds(run).size() >= n;
  };
  std::mt19937 rng(static_cast<unsigned>(getpid()));
  // A client dies mid-run and comes back.
  ASSERT_TRUE(wait_rounds(1));
  const int victim = static_cast<int>(rng() % 2);
  kill(clients[victim], SIGKILL);
  Wait(clients[victim], 10);
  clients[victim] = start_client(victim);
  // The server dies without warning and comes back on the same address and run dir.
  ASSERT_TRUE(wait_rounds(2));
  kill(server, SIGKILL);
  Wait(server, 10);
  server = start_server(addr, 1);
  ASSERT_FALSE(testing::WaitForAddress(run).empty());
  fs::remove(run / "server.addr");
  // Now it is stopped cleanly; the clients must not take that for the end of the run.
  ASSERT_TRUE(wait_rounds(3));
  kill(server, SIGTERM);
  EXPECT_EQ(Wait(server, 30), 130);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  for (pid_t c : clients) EXPECT_EQ(waitpid(c, nullptr, WNOHANG), 0) << "a client exited";
  server = start_server(addr, 2);
  const int rc = Wait(server, 300);
  const std::string log = ReadFile((run / "server.log").string()).value_or("");
  ASSERT_EQ(rc, 0) << log;
  for (pid_t c : clients) EXPECT_EQ(Wait(c, 30), 0);
  std::vector<int> all(40);
  std::iota(all.begin(), all.end(), 1);
  EXPECT_EQ(RecordedRounds(run), all) << log;
  EXPECT_NE(log.find("resuming run"), std::string::npos);
  // The checkpoint holds the last round: a server started on it resumes after round 40
  // and has nothing left to do.
  pid_t again = start_server("127.0.0.1:0", 3);
  EXPECT_EQ(Wait(again, 60), 0);
  EXPECT_EQ(RecordedRounds(run), all)
      << "a finished run, resumed, commits nothing more";
}

TEST_F(LocalTest, ARunSurvivesKilledClientsAndServerRestarts) { SurviveKillsAndRestarts(""); }

// Async: nothing is applied twice across kill -9 either (an open buffer's updates are
// lost and redone, never counted twice).
TEST_F(LocalTest, AnAsyncRunSurvivesKilledClientsAndServerRestarts) {
  SurviveKillsAndRestarts("scheduler: {mode: async, buffer_size: 2}\n");
}

// Hierarchical aggregation as processes, the topology of deploy/docker-compose-edges.yml:
// a top coordinator, two edge aggregators (cleave-server --upstream) and two clients
// under each, all over mutual TLS with certificates from `cleave certs`. The top sees
// two clients, the edges; every edge round is one top round; everyone exits 0.
TEST_F(LocalTest, TwoEdgeAggregatorsUnderOneCoordinator) {
  const fs::path certs = dir_ / "certs";
  ASSERT_EQ(Wait(Spawn({"cleave", "certs", "init", certs.string(), "--san", "127.0.0.1"},
                       "certs.txt"), 60), 0);
  for (const char* name : {"edge-0", "edge-1", "client-0", "client-1", "client-2", "client-3"}) {
    ASSERT_EQ(Wait(Spawn({"cleave", "certs", "issue", certs.string(), name}, "certs.txt"), 60), 0);
  }
  const std::string tls = "tls: {cert: " + (certs / "server.crt").string() +
                          ", key: " + (certs / "server.key").string() +
                          ", ca: " + (certs / "ca.crt").string() + ", mutual: true}\n";
  const std::string top_yaml = (dir_ / "top.yaml").string();
  const std::string edge_yaml = (dir_ / "edge.yaml").string();
  std::ofstream(top_yaml) << R"(
run: {name: edges-top, rounds: 3, seed: 5}
model: {name: mlp}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 1000}
clients: {min: 2, quorum: 1.0, round_deadline_s: 120, join_timeout_s: 60}
train: {batch_size: 32, lr: 0.05, momentum: 0.9}
)" << tls;
  std::ofstream(edge_yaml) << R"(
run: {name: edge}
model: {name: mlp}
data: {test: ""}
clients: {min: 2, quorum: 1.0, round_deadline_s: 120, join_timeout_s: 60}
)" << tls;
  const fs::path top_run = dir_ / "top";
  pid_t top = Spawn({"cleave-server", "--config", top_yaml, "--run-dir", top_run.string(),
                     "--listen", "127.0.0.1:0"},
                    "top.txt");
  const std::string top_addr = testing::WaitForAddress(top_run);
  ASSERT_FALSE(top_addr.empty()) << ReadFile((dir_ / "top.txt").string()).value_or("");
  std::vector<pid_t> edges, clients;
  for (int e = 0; e < 2; ++e) {
    const std::string name = "edge-" + std::to_string(e);
    const fs::path run = dir_ / name;
    edges.push_back(Spawn({"cleave-server", "--config", edge_yaml, "--run-dir", run.string(),
                           "--listen", "127.0.0.1:0", "--upstream", top_addr, "--upstream-ca",
                           (certs / "ca.crt").string(), "--upstream-cert",
                           (certs / "clients" / (name + ".crt")).string(), "--upstream-key",
                           (certs / "clients" / (name + ".key")).string()},
                          name + ".txt"));
    const std::string addr = testing::WaitForAddress(run);
    ASSERT_FALSE(addr.empty()) << ReadFile((dir_ / (name + ".txt")).string()).value_or("");
    for (int i = 2 * e; i < 2 * e + 2; ++i) {
      const std::string client = "client-" + std::to_string(i);
      clients.push_back(Spawn(
          {"cleave-client", "--server", addr, "--ca", (certs / "ca.crt").string(), "--cert",
           (certs / "clients" / (client + ".crt")).string(), "--key",
           (certs / "clients" / (client + ".key")).string(), "--data",
           "fmnist:/usr/share/datasets/fashion-mnist,limit=4000", "--partition",
           "iid,client=" + std::to_string(i) + ",of=4", "--give-up-after", "120"},
          client + ".txt"));
    }
  }
  const int rc = Wait(top, 300);
  const std::string log = ReadFile((top_run / "server.log").string()).value_or("");
  ASSERT_EQ(rc, 0) << log;
  for (pid_t e : edges) EXPECT_EQ(Wait(e, 60), 0);
  for (pid_t c : clients) EXPECT_EQ(Wait(c, 60), 0);
  EXPECT_EQ(RecordedRounds(top_run), (std::vector<int>{1, 2, 3})) << log;
  EXPECT_NE(log.find("(edge-0) joined with 2000 examples"), std::string::npos) << log;
  for (const char* e : {"edge-0", "edge-1"}) {
    EXPECT_EQ(RecordedRounds(dir_ / e), (std::vector<int>{1, 2, 3})) << e;
  }
  std::ifstream metrics(top_run / "metrics.jsonl");
  nlohmann::json last;
  for (std::string line; std::getline(metrics, line);) last = nlohmann::json::parse(line);
  EXPECT_EQ(last.value("participants", 0), 2);
  EXPECT_GT(last.value("test_accuracy", 0.0), 0.6) << "four clients' data through two edges";
}

// An edge aggregator killed with SIGKILL mid-run and restarted on its address and run
// directory: the top coordinator counts it as a failed client (the round is retried),
// the edge's clients reconnect to its restart, and every top round is committed once.
TEST_F(LocalTest, AKilledEdgeAggregatorRejoinsAndNothingIsCountedTwice) {
  std::ofstream(config_) << R"(
run: {name: edge-chaos, rounds: 6, seed: 5}
model: {name: mlp}
data: {test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 500}
clients: {min: 2, quorum: 1.0, round_deadline_s: 120, join_timeout_s: 120}
server: {heartbeat_s: 0.5, client_timeout_s: 3}
)";
  const std::string edge_yaml = (dir_ / "edge.yaml").string();
  std::ofstream(edge_yaml) << R"(
run: {name: edge}
model: {name: mlp}
data: {test: ""}
clients: {min: 2, quorum: 1.0, round_deadline_s: 120, join_timeout_s: 120}
server: {heartbeat_s: 0.5, client_timeout_s: 3}
)";
  const fs::path top_run = dir_ / "top";
  pid_t top = Spawn({"cleave-server", "--config", config_, "--run-dir", top_run.string(),
                     "--listen", "127.0.0.1:0", "--insecure"},
                    "top.txt");
  const std::string top_addr = testing::WaitForAddress(top_run);
  ASSERT_FALSE(top_addr.empty());
  auto start_edge = [&](int e, const std::string& listen, int n) {
    return Spawn({"cleave-server", "--config", edge_yaml, "--run-dir",
                  (dir_ / ("edge-" + std::to_string(e))).string(), "--listen", listen,
                  "--insecure", "--upstream", top_addr, "--upstream-insecure", "--upstream-name",
                  "edge-" + std::to_string(e)},
                 "edge" + std::to_string(e) + "-" + std::to_string(n) + ".txt");
  };
  std::vector<pid_t> edges;
  std::vector<std::string> addrs;
  std::vector<pid_t> clients;
  for (int e = 0; e < 2; ++e) {
    edges.push_back(start_edge(e, "127.0.0.1:0", 0));
    addrs.push_back(testing::WaitForAddress(dir_ / ("edge-" + std::to_string(e))));
    ASSERT_FALSE(addrs.back().empty());
    fs::remove(dir_ / ("edge-" + std::to_string(e)) / "server.addr");
    for (int i = 2 * e; i < 2 * e + 2; ++i) {
      clients.push_back(Spawn({"cleave-client", "--server", addrs.back(), "--insecure", "--data",
                               "fmnist:/usr/share/datasets/fashion-mnist,limit=2000",
                               "--partition", "iid,client=" + std::to_string(i) + ",of=4",
                               "--give-up-after", "120"},
                              "client" + std::to_string(i) + ".txt"));
    }
  }
  for (int i = 0; i < 12000 && RecordedRounds(top_run).size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(RecordedRounds(top_run).size(), 2u);
  kill(edges[1], SIGKILL);
  Wait(edges[1], 10);
  edges[1] = start_edge(1, addrs[1], 1);
  const int rc = Wait(top, 300);
  const std::string log = ReadFile((top_run / "server.log").string()).value_or("");
  ASSERT_EQ(rc, 0) << log;
  for (pid_t e : edges) EXPECT_EQ(Wait(e, 60), 0);
  for (pid_t c : clients) EXPECT_EQ(Wait(c, 60), 0);
  EXPECT_EQ(RecordedRounds(top_run), (std::vector<int>{1, 2, 3, 4, 5, 6})) << log;
}

}  // namespace
}  // namespace cleave
