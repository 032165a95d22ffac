#include "tools/simulate.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/shared.h"
#include "core/config.h"
#include "core/files.h"
#include "core/logging.h"
#include "data/dataset.h"
#include "models/model.h"
#include "server/server.h"
#include "tools/round_lines.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;
volatile sig_atomic_t g_interrupted = 0;

// The process's peak resident memory so far.
int64_t PeakRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

}  // namespace

int RunSimulate(const SimulateOptions& o) {
  auto fail = [](const std::string& why) {
    std::cerr << "cleave simulate: " << why << "\n";
    return 2;
  };
  auto config = JobConfig::Load(o.config_path);
  if (!config.ok()) return fail(std::string(config.status().message()));
  const int clients = o.clients > 0 ? o.clients : config->local.clients;
  if (o.rounds > 0) config->run.rounds = o.rounds;
  if (clients < config->clients.min_clients) {
    return fail(absl::StrCat("--clients ", clients, " is below clients.min=",
                             config->clients.min_clients, " of ", o.config_path));
  }
  if (config->tls.mutual) {
    return fail(o.config_path + " sets tls.mutual: virtual clients have no certificates");
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int slots = o.task_slots > 0 ? o.task_slots : cores;
  if (config->secure_aggregation.enabled) {
    // Every sampled client takes part in each SecAgg stage: one waiting for a slot would
    // stall the others until the stage times out.
    const int sampled = config->clients.per_round > 0 ? config->clients.per_round : clients;
    slots = std::max(slots, sampled);
  }
  const std::string run_dir =
      o.run_dir.empty() ? absl::StrCat("runs/", config->run.name, "-sim-", Timestamp()) : o.run_dir;
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) return fail(absl::StrCat("cannot create ", run_dir, ": ", ec.message()));
  if (Status s = SetupLogging("simulate", run_dir + "/simulate.log", o.log_level, "warn");
      !s.ok()) {
    return fail(std::string(s.message()));
  }
  SetTorchThreads(1);

  // Every client's data: the training set loaded once and partitioned, as
  // `cleave-client --partition SCHEME,client=I,of=N` would keep it.
  auto all = LoadDataSpec(config->local.data, /*train=*/true);
  if (!all.ok()) return fail(std::string(all.status().message()));
  auto parts = PartitionDataset(*all, config->local.partition, clients,
                                config->local.partition_seed);
  if (!parts.ok()) return fail(std::string(parts.status().message()));

  ServerOptions so;
  so.config = *config;
  so.run_dir = run_dir;
  so.config_text = ReadFile(o.config_path).value_or("");
  so.in_process_only = true;
  auto server = Server::Create(std::move(so));
  if (!server.ok()) return fail(std::string(server.status().message()));
  if (Status s = (*server)->Start(); !s.ok()) return fail(std::string(s.message()));

  // Thousands of threads (each client's control stream and heartbeat) that mostly wait:
  // smaller stacks than glibc's default 8 MiB keep the address space modest. Training
  // runs on these threads too; 1 MiB is far more than LibTorch's CPU kernels use.
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  pthread_setattr_default_np(&attr);
  pthread_attr_destroy(&attr);

  auto task_slots = std::make_shared<TaskSlots>(slots);
  auto heartbeats = std::make_shared<Heartbeats>();
  auto channel = (*server)->InProcessChannel();
  std::vector<std::unique_ptr<Client>> virtual_clients;
  int empty = 0;
  int64_t examples = 0;
  for (int i = 0; i < clients; ++i) {
    ClientOptions c;
    c.channel = channel;
    c.server = "in-process";
    c.name = absl::StrCat("sim-", i);
    c.train = PartOf(*all, (*parts)[i]);
    if (c.train.size == 0) {  // a skewed partition can leave a client without data
      ++empty;
      continue;
    }
    c.holdout = TakeHoldout(&c.train, config->local.holdout, /*seed=*/7);
    if (c.train.size == 0) {
      ++empty;
      continue;
    }
    examples += c.train.size;
    if (!config->local.profiles.empty()) {
      c.emulation = config->local.profiles[i % config->local.profiles.size()];
      c.memory_limit_bytes = c.emulation.memory_limit_mb << 20;
    }
    if (config->local.attackers > 0 && i >= clients - config->local.attackers) {
      c.attack = config->local.attack;
    }
    c.task_slots = task_slots;
    c.heartbeats = heartbeats;
    virtual_clients.push_back(std::make_unique<Client>(std::move(c)));
  }
  all = Dataset();  // each client holds its own part now
  std::cout << "cleave simulate: " << config->run.name << ", " << virtual_clients.size()
            << " virtual clients in this process (" << examples << " examples";
  if (empty > 0) std::cout << "; " << empty << " got no examples and are left out";
  std::cout << "), " << config->run.rounds << " rounds, model " << config->model.name
            << ", strategy " << config->strategy.name << ", partition "
            << config->local.partition << ", " << slots << " task slots\n"
            << std::flush;
  if (static_cast<int>(virtual_clients.size()) < config->clients.min_clients) {
    return fail(absl::StrCat("only ", virtual_clients.size(), " clients have data, below clients.min=",
                             config->clients.min_clients));
  }

  struct sigaction sa {};
  sa.sa_handler = [](int) { g_interrupted = 1; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const auto start = std::chrono::steady_clock::now();
  std::atomic<bool> server_done{false};
  Status result;
  std::thread server_thread([&] {
    result = (*server)->Run();
    server_done = true;
  });
  std::vector<std::thread> threads;
  threads.reserve(virtual_clients.size());
  std::atomic<int> client_errors{0};
  for (auto& c : virtual_clients) {
    threads.emplace_back([&client_errors, client = c.get()] {
      if (!client->Run().ok()) ++client_errors;
    });
  }
  RoundPrinter printer(run_dir, config->run.rounds);
  while (!server_done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    printer.Drain();
    if (g_interrupted) (*server)->Stop();
  }
  server_thread.join();
  printer.Drain();
  // A completed run told its clients it ended; otherwise they would keep reconnecting.
  if (!result.ok()) {
    for (auto& c : virtual_clients) c->Stop();
  }
  for (auto& t : threads) t.join();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t peak = PeakRssBytes();
  virtual_clients.clear();  // before the server whose channel they hold
  server->reset();
  if (g_interrupted) {
    std::cout << "cleave simulate: interrupted; the last committed round is checkpointed in "
              << run_dir << "\n";
    return 130;
  }
  if (!result.ok()) {
    std::cout << "cleave simulate: the run failed: " << result.message() << "; see " << run_dir
              << "/simulate.log\n";
    return 1;
  }
  std::cout << absl::StrFormat(
      "done: %d rounds in %.0fs; final %s; %s up, %s down; peak memory %s for %d clients\n",
      printer.last().value("round", 0), secs, AccuracyText(printer.last()),
      Bytes(printer.total_up()), Bytes(printer.total_down()), Bytes(peak),
      static_cast<int>(threads.size()));
  if (client_errors > 0) {
    std::cout << client_errors << " virtual client(s) ended with an error; see " << run_dir
              << "/simulate.log\n";
  }
  std::cout << "run directory: " << run_dir << " (metrics.jsonl, simulate.log, checkpoint.pb)\n";
  return 0;
}

}  // namespace cleave
