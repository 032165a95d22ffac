// Split-learning benchmarks (docs/benchmarks.md):
//   bench_split cut [gpt]     for several device/link profiles, the step time at the cut
//                             the server chooses (split.cut: auto) against the best step
//                             time found by trying every cut; target auto/best <= 1.10.
//   bench_split window        on a slow link, the step time with split.window 2 and 4
//                             against window 1 (the ratio is the speed-up from overlapping).
//   bench_split memory [gpt]  the peak RSS of a cleave-client process training at a
//                             shallow cut against one training the whole model (federated).
//   bench_split busy [gpt]    the server's busy fraction with 1, 2 and 4 clients on a
//                             limited link (window 1 and 2): its compute hiding transfers.
//   bench_split qlora [STEPS] a SmolLM2-135M-shaped model (tests/models/llama_reference.py
//                             smol: random weights) LoRA-fine-tuned split (sfl-v2, auto
//                             cut, window 2) on fortunes with a float32, int8 and NF4
//                             base: the cut, bytes a step each way, tokens/s, the
//                             server's busy share (device memory: bench_qlora memory).
// Workloads: vgg on Fashion-MNIST (default), or `gpt`: the decoder of
// deploy/examples/fortunes-gpt.yaml on fortunes (4 blocks of width 128, context 64).
// Server and client run in this process (the client emulating the device) over loopback.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/spawn.h"
#include "client/client.h"
#include "data/dataset.h"
#include "job/job.h"
#include "models/model.h"
#include "models/part.h"
#include "server/server.h"
#include "split/cut_policy.h"

using namespace cleave;

namespace {

const char* kFmnist = "/usr/share/datasets/fashion-mnist";
const char* kFortunes = "/usr/share/games/fortunes";

struct Device {
  std::string name;
  DeviceEmulation emulation;
};

// What trains: the model and data config lines, the client's data source, and how long
// a round is.
struct Workload {
  std::string name;
  std::string model;  // the model: mapping
  std::string data;   // the data: mapping (the server's test set)
  std::string train;  // the train: mapping's optimizer part
  std::string client_data;  // a data source spec for the client
  int cuts = 0;       // cuts 1..cuts
};

Workload Vgg() {
  return {"vgg", "name: vgg", "test_limit: 200", "lr: 0.02, momentum: 0.5",
          absl::StrCat("fmnist:", kFmnist), 8};
}

Workload Gpt() {
  return {"gpt",
          "name: gpt, gpt: {vocab: 256, context: 64, layers: 4, heads: 4, dim: 128}",
          absl::StrCat("test: \"text:", kFortunes, "/wisdom,context=64\", test_limit: 64"),
          "optimizer: adamw, lr: 0.002", absl::StrCat("text:", kFortunes, "/wisdom,context=64"),
          5};
}

// The job: `rounds` rounds of `clients` clients, one epoch of `batch`-sized micro-batches.
std::string Yaml(const Workload& w, const std::string& split, int rounds, int batch, int clients) {
  return absl::StrCat(
      "model: {", w.model, "}\nrun: {rounds: ", rounds, ", seed: 1}\nclients: {min: ", clients,
      ", quorum: 1.0}\n",
      "data: {", w.data, "}\n", "train: {local_epochs: 1, batch_size: ", batch, ", ", w.train,
      "}\n", "split: {", split, "}\n", "server: {heartbeat_s: 1, client_timeout_s: 60}\n");
}

// The server's cost model for a cut, on this machine's profile of the model, with the
// device's memory limit: what the bench cannot learn from a fixed cut's run (the client
// sends no profile then).
CutPrediction Predict(const Workload& w, const std::string& split, int cut, int batch,
                      int64_t limit_mb) {
  auto config = ParseJob(Yaml(w, split, 1, batch, 1), "");
  if (!config.ok()) std::exit(2);
  const ModelSpec spec = ModelSpecOf(config->model, config->run.seed);
  const std::vector<int64_t> sample =
      spec.name == "gpt" ? std::vector<int64_t>{spec.gpt.context} : spec.input_shape;
  auto profile = ProfileStages(spec, sample, batch, 1);
  if (!profile.ok()) std::exit(2);
  CutProblem p = ModelCutProblem(*profile, sample, config->train, config->split.window);
  p.memory_limit_bytes = limit_mb << 20;
  return PredictStep(p, cut);
}

// Runs the job against an in-process server with `clients` emulated devices; returns
// the server's metrics of every round, or an empty history when the run failed.
std::vector<RoundMetrics> Run(const Workload& w, const std::string& split, const Device& d,
                              int rounds, int64_t examples, int batch, int clients = 1) {
  auto config = ParseJob(Yaml(w, split, rounds, batch, clients), "");
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    std::exit(2);
  }
  ServerOptions so;
  so.config = *config;
  so.listen = "127.0.0.1:0";
  so.insecure = true;
  auto server = Server::Create(std::move(so));
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
    return {};
  }
  if (Status s = (*server)->Start(); !s.ok()) {
    std::fprintf(stderr, "server: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  auto data = LoadDataSpec(absl::StrCat(w.client_data, ",limit=", examples), true);
  if (!data.ok()) {
    std::fprintf(stderr, "data: %s\n", data.status().ToString().c_str());
    std::exit(1);
  }
  std::vector<std::unique_ptr<Client>> devices;
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    ClientOptions co;
    co.server = absl::StrCat("127.0.0.1:", (*server)->port());
    co.name = clients == 1 ? "device" : absl::StrCat("device-", i);
    co.train = *data;
    co.emulation = d.emulation;
    co.memory_limit_bytes = d.emulation.memory_limit_mb << 20;
    co.insecure = true;
    devices.push_back(std::make_unique<Client>(std::move(co)));
  }
  for (auto& c : devices) threads.emplace_back([&c] { c->Run().IgnoreError(); });
  Status s = (*server)->Run();
  for (auto& t : threads) t.join();
  if (!s.ok()) {
    std::fprintf(stderr, "run failed: %s\n", s.ToString().c_str());
    return {};
  }
  return (*server)->History();
}

int CutBench(const Workload& w) {
  std::vector<Device> devices;
  std::string split = "mode: sfl-v2";
  if (w.name == "vgg") {
    // vgg's per-sample activation bytes shrink from 25 KB (cut 1) to 0.5 KB (cut 8).
    devices = {
        {"fast device, 2/8 Mbit/s link", {2, 8, 1, 0}},
        {"phone: 4x slower, 20/50 Mbit/s", {20, 50, 4, 0}},
        {"laptop: 2x slower, 100/100 Mbit/s", {100, 100, 2, 0}},
        {"IoT board: 30x slower, 1 Gbit/s", {1000, 1000, 30, 0}},
    };
  } else {
    // Every cut of the decoder sends the same 32 KB a sequence, so the cut trades the
    // device's compute against the server's; with two micro-batches in flight they
    // overlap, and the best cut balances them. Attention memory limits how deep a small
    // device may cut.
    devices = {
        {"fast device, 1 Gbit/s", {1000, 1000, 1, 0}},
        {"laptop: 2x slower, 200/200 Mbit/s", {200, 200, 2, 0}},
        {"phone: 4x slower, 50/100 Mbit/s", {50, 100, 4, 0}},
        {"board: as fast, 1 Gbit/s, 32 MiB for training", {1000, 1000, 1, 32}},
    };
    split += ", window: 2";
  }
  const int64_t examples = 320;
  const int batch = 16;
  std::printf("%s, %s, batch %d, %lld examples per round; step = mean wall time per "
              "micro-batch\n\n",
              w.name.c_str(), split.c_str(), batch, static_cast<long long>(examples));
  double worst = 0;
  for (const auto& d : devices) {
    std::printf("%s\n", d.name.c_str());
    std::vector<double> step(w.cuts + 1, 0);
    int best_cut = 0;
    for (int cut = 1; cut <= w.cuts; ++cut) {
      if (d.emulation.memory_limit_mb > 0 &&
          !Predict(w, split, cut, batch, d.emulation.memory_limit_mb).fits) {
        std::printf("  cut %d: does not fit the device's memory\n", cut);
        continue;
      }
      auto h = Run(w, absl::StrCat(split, ", cut: ", cut), d, 1, examples, batch);
      if (h.empty()) return 1;
      step[cut] = h[0].split.value().step_s;
      std::printf("  cut %d: %8.1f ms\n", cut, 1e3 * step[cut]);
      if (best_cut == 0 || step[cut] < step[best_cut]) best_cut = cut;
    }
    // Three rounds: the first decides from the join-time profile, later ones from
    // measured steps. The verdict compares the step time at the cut auto settles on with
    // the best one, both from the sweep above (measured the same way); auto's own last
    // round is printed too (same cut, another run: that difference is noise).
    auto h = Run(w, split + ", cut: auto", d, 3, examples, batch);
    if (h.empty() || best_cut == 0) {
      std::printf("  auto: failed\n\n");
      worst = 1e9;
      continue;
    }
    std::string cuts;
    for (const auto& m : h) absl::StrAppend(&cuts, cuts.empty() ? "" : " -> ", m.split.value().cuts.begin()->second);
    const int chosen = h.back().split.value().cuts.begin()->second;
    const double ratio = step[chosen] > 0 ? step[chosen] / step[best_cut] : 1e9;
    worst = std::max(worst, ratio);
    std::printf("  auto: cuts %s (its last round %.1f ms); best cut %d (%.1f ms); "
                "step at auto's cut / best = %.3f\n\n",
                cuts.c_str(), 1e3 * h.back().split.value().step_s, best_cut, 1e3 * step[best_cut], ratio);
  }
  std::printf("worst step at auto's cut / best: %.3f (target <= 1.10)\n", worst);
  return 0;
}

int WindowBench() {
  const Device d{"fast device, 5/20 Mbit/s link", {5, 20, 1, 0}};
  std::printf("vgg, sfl-v2, cut 4, batch 32, %s\n", d.name.c_str());
  double base = 0;
  for (int w : {1, 2, 4}) {
    auto h = Run(Vgg(), absl::StrCat("mode: sfl-v2, cut: 4, window: ", w), d, 1, 320, 32);
    if (w == 1) base = h[0].split.value().step_s;
    std::printf("  window %d: %.1f ms per step (client %.1f, transfer %.1f, server %.1f); "
                "window 1 / window %d = %.2f\n",
                w, 1e3 * h[0].split.value().step_s, 1e3 * h[0].split.value().client_compute_s, 1e3 * h[0].split.value().transfer_s,
                1e3 * h[0].split.value().server_compute_s, w, base / h[0].split.value().step_s);
  }
  return 0;
}

// The server's busy fraction as clients are added: each client's link and compute
// leave the server idle between its micro-batches; other clients' micro-batches fill
// those gaps, so its compute hides their transfers.
int BusyBench(const Workload& w) {
  const Device d{"50/50 Mbit/s link, as fast as the server", {50, 50, 1, 0}};
  const int cut = w.name == "gpt" ? 1 : 2;
  const int batch = 16;
  const int64_t examples = w.name == "gpt" ? 160 : 320;
  std::printf("%s, sfl-v2, cut %d, batch %d, %lld examples per client; %s\n\n", w.name.c_str(),
              cut, batch, static_cast<long long>(examples), d.name.c_str());
  std::printf("| clients | window | server busy | step (ms) | round (s) | samples/s at the server |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (int window : {1, 2}) {
    for (int clients : {1, 2, 4}) {
      auto h = Run(w, absl::StrCat("mode: sfl-v2, cut: ", cut, ", window: ", window), d, 1, examples,
                   batch, clients);
      if (h.empty()) return 1;
      std::printf("| %d | %d | %.2f | %.1f | %.2f | %.0f |\n", clients, window, h[0].split.value().server_busy,
                  1e3 * h[0].split.value().step_s, h[0].wall_s, clients * examples / h[0].wall_s);
    }
  }
  return 0;
}

// Peak RSS of a cleave-client process (started next to this binary) that does one task
// against a server in this process: the kernel's ru_maxrss of the child, from wait4.
long PeakRssKb(const Workload& w, const std::string& split, int batch, int64_t examples,
               int steps) {
  const std::string yaml = absl::StrCat(
      "model: {", w.model, "}\nrun: {rounds: 1, seed: 1}\nclients: {min: 1}\n",
      "data: {", w.data, "}\ntrain: {batch_size: ", batch, ", ", w.train,
      steps > 0 ? absl::StrCat(", local_steps: ", steps) : ", local_epochs: 1", "}\n",
      split.empty() ? "" : absl::StrCat("split: {", split, "}\n"));
  ServerOptions so;
  so.config = *ParseJob(yaml, "");
  so.listen = "127.0.0.1:0";
  so.insecure = true;
  auto server = Server::Create(std::move(so));
  if (!server.ok() || !(*server)->Start().ok()) std::exit(1);
  char self[4096] = {0};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) std::exit(1);
  std::string bin = self;
  bin = bin.substr(0, bin.rfind('/')) + "/cleave-client";
  std::vector<std::string> argv = {bin, "--server", absl::StrCat("127.0.0.1:", (*server)->port()),
                                   "--data", absl::StrCat(w.client_data, ",limit=", examples),
                                   "--insecure", "--log-level", "warn"};
  const pid_t pid = SpawnExec(argv);
  (*server)->Run().IgnoreError();
  int status = 0;
  rusage ru{};
  wait4(pid, &status, 0, &ru);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "cleave-client failed (status %d)\n", status);
    std::exit(1);
  }
  return ru.ru_maxrss;
}

int QloraBench(int steps) {
  const std::string dir = "/tmp/cleave_bench_smol";
  if (access((dir + "/model.safetensors").c_str(), R_OK) != 0 &&
      std::system(absl::StrCat("/usr/bin/python3 ", CLEAVE_SOURCE_DIR, "/tests/models/llama_reference.py make ", dir,
                               " smol F32 1 7").c_str()) != 0) {
    return 1;
  }
  const int batch = 4;
  const Device d{"1 Gbit/s, as fast as the server", {1000, 1000, 1, 0}};
  std::printf("SmolLM2-135M shape, LoRA rank 8 (all seven projections), adamw, sfl-v2, cut: auto, window 2, "
              "one device (%s), %d steps of %d x 64 tokens of fortunes (bytes)\n\n",
              d.name.c_str(), steps, batch);
  std::printf("| base | cut | KiB up / step | KiB down / step | step (ms) | tokens/s | server busy |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const char* base : {"none", "int8", "nf4"}) {
    const Workload w{"smol",
                     absl::StrCat("name: hf, path: ", dir, ", gpt: {context: 64}, lora: {rank: 8}, quantize: ", base),
                     absl::StrCat("test: \"text:", kFortunes, "/wisdom,context=64\", test_limit: 8"),
                     "optimizer: adamw, lr: 0.001", absl::StrCat("text:", kFortunes, "/wisdom,context=64"), 0};
    auto h = Run(w, "mode: sfl-v2, cut: auto, window: 2", d, 1, int64_t{steps} * batch, batch);
    if (h.empty()) return 1;
    const SplitMetrics& m = h[0].split.value();
    std::string cuts;
    for (const auto& [client, cut] : m.cuts) cuts += absl::StrCat(cuts.empty() ? "" : ",", cut);
    std::printf("| %s | %s | %.1f | %.1f | %.0f | %.0f | %.2f |\n", base, cuts.c_str(),
                m.activation_bytes_up / 1024.0 / steps, m.gradient_bytes_down / 1024.0 / steps, 1e3 * m.step_s,
                batch * 64 / m.step_s, m.server_busy);
  }
  return 0;
}

int MemoryBench(const Workload& w) {
  const bool gpt = w.name == "gpt";
  const int batch = gpt ? 64 : 128;
  const int64_t examples = gpt ? 640 : 2000;
  const int steps = gpt ? 10 : 0;
  std::printf("cleave-client peak RSS (the whole process: LibTorch, gRPC, %lld examples), "
              "%s, batch %d\n",
              static_cast<long long>(examples), w.name.c_str(), batch);
  const long whole = PeakRssKb(w, "", batch, examples, steps);
  std::printf("  whole model (federated):        %7.1f MiB\n", whole / 1024.0);
  for (int cut : gpt ? std::vector<int>{1, 2, 3} : std::vector<int>{1, 2, 4}) {
    const std::string split = absl::StrCat("mode: sfl-v2, cut: ", cut);
    const long part = PeakRssKb(w, split, batch, examples, steps);
    const double model_mib = Predict(w, split, cut, batch, 0).client_memory_bytes / 1048576.0;
    std::printf("  split at cut %d (sfl-v2):        %7.1f MiB  (%.2fx the whole model's; the cost "
                "model's training memory for the part: %.1f MiB)\n",
                cut, part / 1024.0, static_cast<double>(part) / whole, model_mib);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string what = argc > 1 ? argv[1] : "";
  const std::string workload = argc > 2 ? argv[2] : "vgg";
  SetTorchThreads(1);
  if (what == "qlora") return QloraBench(argc > 2 ? std::atoi(argv[2]) : 16);
  if (workload != "vgg" && workload != "gpt") what.clear();
  const Workload w = workload == "gpt" ? Gpt() : Vgg();
  if (what == "cut") return CutBench(w);
  if (what == "window") return WindowBench();
  if (what == "memory") return MemoryBench(w);
  if (what == "busy") return BusyBench(w);
  std::fprintf(stderr, "usage: bench_split cut|memory|busy [vgg|gpt] | window | qlora [STEPS]\n");
  return 2;
}
