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

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/shared.h"
#include "core/device_trace.h"
#include "core/files.h"
#include "core/logging.h"
#include "data/dataset.h"
#include "job/job.h"
#include "models/model.h"
#include "server/server.h"
#include "tools/report.h"
#include "tools/round_lines.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;
volatile sig_atomic_t g_simulation_interrupted = 0;

// The process's peak resident memory so far.
int64_t PeakRssBytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

int Fail(const std::string& why) {
  std::cerr << "cleave simulate: " << why << "\n";
  return 2;
}

// A virtual client, started again from `options` when its trace brings it back online.
struct Virtual {
  ClientOptions options;
  const DeviceTrace* trace = nullptr;
  std::unique_ptr<Client> client;
  std::thread thread;
  Status status;  // of its last Run

  void Launch() {
    client = std::make_unique<Client>(options);
    thread = std::thread([this] { status = client->Run(); });
  }
};

// Stops `stopping` together (each Stop is quick; the joins then overlap).
void Halt(const std::vector<Virtual*>& stopping) {
  for (Virtual* v : stopping) v->client->Stop();
  for (Virtual* v : stopping) {
    v->thread.join();
    v->client.reset();
  }
}

// What a simulation works with: the job, the in-process server and the virtual clients.
struct Simulation {
  JobConfig config;
  int clients = 0;
  int slots = 0;  // task slots: clients training at once
  std::string run_dir;
  std::vector<DeviceTrace> traces;  // local.trace; empty: none
  std::unique_ptr<Server> server;
  std::vector<Virtual> virtuals;    // a stable address each (their threads point at them)
  int empty = 0;                    // clients a skewed partition left without data
  int64_t examples = 0;
  int64_t dropouts = 0, returns = 0;
};

// The job, the task slots, the run directory and the log. 0, or the exit code.
int Prepare(const SimulateOptions& o, Simulation& sim) {
  auto config = LoadJob(o.config_path);
  if (!config.ok()) return Fail(std::string(config.status().message()));
  sim.config = *std::move(config);
  JobConfig& c = sim.config;
  sim.clients = o.clients > 0 ? o.clients : c.local.clients;
  if (o.rounds > 0) c.run.rounds = o.rounds;
  if (sim.clients < c.clients.min_clients) {
    return Fail(absl::StrCat("--clients ", sim.clients, " is below clients.min=",
                             c.clients.min_clients, " of ", o.config_path));
  }
  if (c.tls.mutual) {
    return Fail(o.config_path + " sets tls.mutual: virtual clients have no certificates");
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  sim.slots = o.task_slots > 0 ? o.task_slots : cores;
  if (c.secure_aggregation.enabled || c.ClientsServePeer()) {
    // Every sampled client takes part in each SecAgg stage, a gossip client waits for
    // its neighbours' models and a pipeline's device for its upstream's micro-batches:
    // one waiting for a slot would stall the others until the stage or the round times
    // out.
    const int sampled = c.clients.per_round > 0 ? c.clients.per_round : sim.clients;
    sim.slots = std::max(sim.slots, sampled);
  }
  sim.run_dir =
      o.run_dir.empty() ? absl::StrCat("runs/", c.run.name, "-sim-", Timestamp()) : o.run_dir;
  std::error_code ec;
  fs::create_directories(sim.run_dir, ec);
  if (ec) return Fail(absl::StrCat("cannot create ", sim.run_dir, ": ", ec.message()));
  if (Status s = SetupLogging("simulate", sim.run_dir + "/simulate.log", o.log_level, "warn");
      !s.ok()) {
    return Fail(std::string(s.message()));
  }
  SetTorchThreads(1);
  return 0;
}

// Every client's options: its part of the training set (loaded once and partitioned as
// `cleave-client --partition SCHEME,client=I,of=N` would keep it), its held-out data,
// device, role and the shared task slots and heartbeats. 0, or the exit code.
int MakeVirtualClients(Simulation& sim) {
  const JobConfig& c = sim.config;
  auto all = LoadDataSpec(c.local.data, /*train=*/true);
  if (!all.ok()) return Fail(std::string(all.status().message()));
  auto parts = PartitionDataset(*all, c.local.partition, sim.clients, c.local.partition_seed);
  if (!parts.ok()) return Fail(std::string(parts.status().message()));
  auto task_slots = std::make_shared<TaskSlots>(sim.slots);
  auto heartbeats = std::make_shared<Heartbeats>();
  auto channel = sim.server->InProcessChannel();
  sim.virtuals.reserve(sim.clients);
  for (int i = 0; i < sim.clients; ++i) {
    ClientOptions v;
    v.channel = channel;
    v.server = "in-process";
    v.name = absl::StrCat("sim-", i);
    v.train = PartOf(*all, (*parts)[i]);
    if (v.train.size > 0) v.holdout = TakeHoldout(&v.train, c.local.holdout, /*seed=*/7);
    if (v.train.size == 0) {  // a skewed partition can leave a client without data
      ++sim.empty;
      continue;
    }
    sim.examples += v.train.size;
    const DeviceTrace* trace = sim.traces.empty() ? nullptr : &sim.traces[i % sim.traces.size()];
    if (trace) {
      v.emulation = trace->device;
    } else if (!c.local.profiles.empty()) {
      v.emulation = c.local.profiles[i % c.local.profiles.size()];
    }
    // One process holds every virtual client: a budget is for its training alone.
    v.memory_limit_bytes = v.emulation.memory_limit_mb << 20;
    v.count_resident = false;
    if (c.local.attackers > 0 && i >= sim.clients - c.local.attackers) v.attack = c.local.attack;
    v.task_slots = task_slots;
    v.heartbeats = heartbeats;
    // Gossip and pipelines: the server stays in-process, but neighbours exchange models
    // or micro-batches peer to peer, each virtual client serving Peer on a loopback port
    // of its own.
    if (c.ClientsServePeer()) v.peer_listen = "127.0.0.1:0";
    Virtual virt;
    virt.options = std::move(v);
    virt.trace = trace;
    sim.virtuals.push_back(std::move(virt));
  }
  return 0;
}

void PrintBanner(const Simulation& sim) {
  const JobConfig& c = sim.config;
  int online_at_start = 0;
  for (const Virtual& v : sim.virtuals) online_at_start += !v.trace || v.trace->OnlineAt(0);
  std::cout << "cleave simulate: " << c.run.name << ", " << sim.virtuals.size()
            << " virtual clients in this process (" << sim.examples << " examples";
  if (sim.empty > 0) std::cout << "; " << sim.empty << " got no examples and are left out";
  std::cout << "), " << c.run.rounds << " rounds, model " << c.model.name << ", strategy "
            << c.strategy.name << ", partition " << c.local.partition << ", " << sim.slots
            << " task slots";
  if (!sim.traces.empty()) {
    std::cout << ", trace " << c.local.trace << " (" << online_at_start << " online at start)";
  }
  std::cout << "\n" << std::flush;
}

// Runs the server until the run ends or is interrupted, following the trace: clients
// whose window closed leave (a dropout: their task, if any, fails), clients whose window
// opened join again. Then the clients end. The server's result.
Status Drive(Simulation& sim, RoundPrinter& printer, std::chrono::steady_clock::time_point start) {
  std::atomic<bool> server_done{false};
  Status result;
  std::thread server_thread([&] {
    result = sim.server->Run();
    server_done = true;
  });
  for (Virtual& v : sim.virtuals) {
    if (!v.trace || v.trace->OnlineAt(0)) v.Launch();
  }
  while (!server_done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    printer.Drain();
    if (g_simulation_interrupted) sim.server->Stop();
    if (sim.traces.empty()) continue;
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<Virtual*> leaving;
    for (Virtual& v : sim.virtuals) {
      const bool online = v.trace->OnlineAt(t);
      if (online && !v.client) {
        spdlog::info("trace: {} online at {:.1f}s", v.options.name, t);
        v.Launch();
        ++sim.returns;
      } else if (!online && v.client) {
        spdlog::info("trace: {} offline at {:.1f}s", v.options.name, t);
        leaving.push_back(&v);
        ++sim.dropouts;
      }
    }
    Halt(leaving);
  }
  server_thread.join();
  printer.Drain();
  // A completed run told its clients it ended; otherwise they would keep reconnecting.
  std::vector<Virtual*> running;
  for (Virtual& v : sim.virtuals) {
    if (v.client) running.push_back(&v);
  }
  if (!result.ok()) {
    Halt(running);
  } else {
    for (Virtual* v : running) v->thread.join();
  }
  return result;
}

}  // namespace

int RunSimulate(const SimulateOptions& o) {
  Simulation sim;
  if (int code = Prepare(o, sim); code != 0) return code;
  ServerOptions so;
  so.config = sim.config;
  so.run_dir = sim.run_dir;
  so.config_text = ReadFile(o.config_path).value_or("");
  so.in_process_only = true;
  auto server = Server::Create(std::move(so));
  if (!server.ok()) return Fail(std::string(server.status().message()));
  sim.server = *std::move(server);
  if (Status s = sim.server->Start(); !s.ok()) return Fail(std::string(s.message()));
  // Device traces: each client's speed and links, and when it is online.
  if (!sim.config.local.trace.empty()) {
    auto t = ReadDeviceTraces(sim.config.local.trace);
    if (!t.ok()) return Fail(std::string(t.status().message()));
    sim.traces = *std::move(t);
  }
  // Thousands of threads (one per client, waiting on its control stream) and the task
  // workers: smaller stacks than glibc's default 8 MiB keep the address space modest;
  // 1 MiB is far more than LibTorch's CPU kernels use on the workers.
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  pthread_setattr_default_np(&attr);
  pthread_attr_destroy(&attr);
  if (int code = MakeVirtualClients(sim); code != 0) return code;
  PrintBanner(sim);
  if (static_cast<int>(sim.virtuals.size()) < sim.config.clients.min_clients) {
    return Fail(absl::StrCat("only ", sim.virtuals.size(),
                             " clients have data, below clients.min=",
                             sim.config.clients.min_clients));
  }
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_simulation_interrupted = 1; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const auto start = std::chrono::steady_clock::now();
  RoundPrinter printer(sim.run_dir, sim.config.run.rounds);
  const Status result = Drive(sim, printer, start);
  int client_errors = 0;
  for (const Virtual& v : sim.virtuals) {
    client_errors += !v.status.ok() && v.status.code() != absl::StatusCode::kCancelled;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t peak = PeakRssBytes();
  sim.virtuals.clear();  // before the server whose channel they hold
  sim.server.reset();
  if (g_simulation_interrupted) {
    std::cout << "cleave simulate: interrupted; the last committed round is checkpointed in "
              << sim.run_dir << "\n";
    return 130;
  }
  if (!result.ok()) {
    std::cout << "cleave simulate: the run failed: " << result.message() << "; see "
              << sim.run_dir << "/simulate.log\n";
    return 1;
  }
  std::cout << absl::StrFormat(
      "done: %d rounds in %.0fs; final %s; %s up, %s down; peak memory %s for %d clients\n",
      printer.last().value("round", 0), secs, AccuracyText(printer.last()),
      Bytes(printer.total_up()), Bytes(printer.total_down()), Bytes(peak),
      sim.clients - sim.empty);
  if (!sim.traces.empty()) {
    std::cout << "trace: " << sim.dropouts << " dropouts, " << sim.returns << " returns\n";
  }
  if (client_errors > 0) {
    std::cout << client_errors << " virtual client(s) ended with an error; see " << sim.run_dir
              << "/simulate.log\n";
  }
  std::cout << "run directory: " << sim.run_dir
            << " (metrics.jsonl, simulate.log, checkpoint.pb)\n";
  PrintReport(sim.run_dir);
  return 0;
}

}  // namespace cleave
