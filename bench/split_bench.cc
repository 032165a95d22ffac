// Split-learning benchmarks (docs/benchmarks.md):
//   bench_split cut      for several device/link profiles, the step time at the cut the
//                        server chooses (split.cut: auto) against the best step time found
//                        by trying every cut; target auto/best <= 1.10.
//   bench_split window   on a slow link, the step time with split.window 2 and 4 against
//                        window 1 (the ratio is the speed-up from overlapping).
//   bench_split memory   the peak RSS of a cleave-client process training at a shallow cut
//                        against one training the whole model (federated).
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
#include "core/config.h"
#include "data/dataset.h"
#include "models/model.h"
#include "server/server.h"

using namespace cleave;

namespace {

const char* kFmnist = "/usr/share/datasets/fashion-mnist";

struct Device {
  std::string name;
  DeviceEmulation emulation;
};

// Runs `rounds` rounds of one client against an in-process server; returns the
// server's metrics of every round.
std::vector<RoundMetrics> Run(const std::string& split, const Device& d, int rounds,
                              int64_t examples, int batch) {
  const std::string yaml = absl::StrCat(
      "model: {name: vgg}\nrun: {rounds: ", rounds, ", seed: 1}\nclients: {min: 1}\n",
      "data: {test_limit: 200}\n", "train: {local_epochs: 1, batch_size: ", batch,
      ", lr: 0.02, momentum: 0.5}\n", "split: {", split, "}\n",
      "server: {heartbeat_s: 1, client_timeout_s: 60}\n");
  auto config = JobConfig::Parse(yaml, "");
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    std::exit(2);
  }
  ServerOptions so;
  so.config = *config;
  so.listen = "127.0.0.1:0";
  so.insecure = true;
  auto server = Server::Create(std::move(so));
  if (!server.ok() || !(*server)->Start().ok()) {
    std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
    std::exit(1);
  }
  ClientOptions co;
  co.server = absl::StrCat("127.0.0.1:", (*server)->port());
  co.name = "device";
  co.train = *LoadFashionMnist(kFmnist, true, examples);
  co.emulation = d.emulation;
  co.insecure = true;
  Client client(std::move(co));
  std::thread ct([&] { client.Run().IgnoreError(); });
  Status s = (*server)->Run();
  ct.join();
  if (!s.ok()) {
    std::fprintf(stderr, "run failed: %s\n", s.ToString().c_str());
    std::exit(1);
  }
  return (*server)->History();
}

int CutBench() {
  // vgg's per-sample activation bytes shrink from 25 KB (cut 1) to 0.5 KB (cut 8).
  const std::vector<Device> devices = {
      {"fast device, 2/8 Mbit/s link", {2, 8, 1, 0}},
      {"phone: 4x slower, 20/50 Mbit/s", {20, 50, 4, 0}},
      {"laptop: 2x slower, 100/100 Mbit/s", {100, 100, 2, 0}},
      {"IoT board: 30x slower, 1 Gbit/s", {1000, 1000, 30, 0}},
  };
  const int64_t examples = 320;
  const int batch = 16;
  std::printf("vgg, sfl-v2, batch %d, %lld examples per round; step = mean wall time per "
              "micro-batch\n\n",
              batch, static_cast<long long>(examples));
  double worst = 0;
  for (const auto& d : devices) {
    std::printf("%s\n", d.name.c_str());
    std::vector<double> step(9, 0);
    int best_cut = 1;
    for (int cut = 1; cut <= 8; ++cut) {
      auto h = Run(absl::StrCat("mode: sfl-v2, cut: ", cut), d, 1, examples, batch);
      step[cut] = h[0].step_s;
      std::printf("  cut %d: %8.1f ms\n", cut, 1e3 * step[cut]);
      if (step[cut] < step[best_cut]) best_cut = cut;
    }
    // Three rounds: the first decides from the join-time profile, later ones from
    // measured steps. The verdict compares the step time at the cut auto settles on with
    // the best one, both from the sweep above (measured the same way); auto's own last
    // round is printed too (same cut, another run: that difference is noise).
    auto h = Run("mode: sfl-v2, cut: auto", d, 3, examples, batch);
    std::string cuts;
    for (const auto& m : h) absl::StrAppend(&cuts, cuts.empty() ? "" : " -> ", m.cuts.begin()->second);
    const int chosen = h.back().cuts.begin()->second;
    const double ratio = step[chosen] / step[best_cut];
    worst = std::max(worst, ratio);
    std::printf("  auto: cuts %s (its last round %.1f ms); best cut %d (%.1f ms); "
                "step at auto's cut / best = %.3f\n\n",
                cuts.c_str(), 1e3 * h.back().step_s, best_cut, 1e3 * step[best_cut], ratio);
  }
  std::printf("worst step at auto's cut / best: %.3f (target <= 1.10)\n", worst);
  return 0;
}

int WindowBench() {
  const Device d{"fast device, 5/20 Mbit/s link", {5, 20, 1, 0}};
  std::printf("vgg, sfl-v2, cut 4, batch 32, %s\n", d.name.c_str());
  double base = 0;
  for (int w : {1, 2, 4}) {
    auto h = Run(absl::StrCat("mode: sfl-v2, cut: 4, window: ", w), d, 1, 320, 32);
    if (w == 1) base = h[0].step_s;
    std::printf("  window %d: %.1f ms per step (client %.1f, transfer %.1f, server %.1f); "
                "window 1 / window %d = %.2f\n",
                w, 1e3 * h[0].step_s, 1e3 * h[0].client_compute_s, 1e3 * h[0].transfer_s,
                1e3 * h[0].server_compute_s, w, base / h[0].step_s);
  }
  return 0;
}

// Peak RSS of a cleave-client process (started next to this binary) that does one task
// against a server in this process: the kernel's ru_maxrss of the child, from wait4.
long PeakRssKb(const std::string& split, const std::string& model, int batch) {
  const std::string yaml = absl::StrCat(
      "model: {name: ", model, "}\nrun: {rounds: 1, seed: 1}\nclients: {min: 1}\n",
      "data: {test_limit: 200}\ntrain: {local_epochs: 1, batch_size: ", batch, "}\n",
      split.empty() ? "" : absl::StrCat("split: {", split, "}\n"));
  ServerOptions so;
  so.config = *JobConfig::Parse(yaml, "");
  so.listen = "127.0.0.1:0";
  so.insecure = true;
  auto server = Server::Create(std::move(so));
  if (!server.ok() || !(*server)->Start().ok()) std::exit(1);
  char self[4096] = {0};
  if (readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) std::exit(1);
  std::string bin = self;
  bin = bin.substr(0, bin.rfind('/')) + "/cleave-client";
  std::vector<std::string> argv = {bin, "--server", absl::StrCat("127.0.0.1:", (*server)->port()),
                                   "--data", absl::StrCat("fmnist:", kFmnist, ",limit=2000"),
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

int MemoryBench() {
  std::printf("cleave-client peak RSS (the whole process: LibTorch, gRPC, 2000 examples), "
              "vgg, batch 128\n");
  const long whole = PeakRssKb("", "vgg", 128);
  std::printf("  whole model (federated):        %7.1f MiB\n", whole / 1024.0);
  for (int cut : {1, 2, 4}) {
    const long part = PeakRssKb(absl::StrCat("mode: sfl-v2, cut: ", cut), "vgg", 128);
    std::printf("  split at cut %d (sfl-v2):        %7.1f MiB  (%.2fx the whole model's)\n", cut,
                part / 1024.0, static_cast<double>(part) / whole);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  SetTorchThreads(1);
  if (what == "cut") return CutBench();
  if (what == "window") return WindowBench();
  if (what == "memory") return MemoryBench();
  std::fprintf(stderr, "usage: bench_split cut|window|memory\n");
  return 2;
}
