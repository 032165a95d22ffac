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
#include "core/config.h"
#include "core/device_trace.h"
#include "core/files.h"
#include "core/logging.h"
#include "data/dataset.h"
#include "models/model.h"
#include "server/server.h"
#include "tools/report.h"
#include "tools/round_lines.h"
#include "job/job.h"

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
  auto config = LoadJob(o.config_path);
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
  if (config->secure_aggregation.enabled || config->scheduler.gossip()) {
    // Every sampled client takes part in each SecAgg stage, and a gossip client waits for
    // its neighbours' models: one waiting for a slot would stall the others until the
    // stage or the round times out.
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

  // Device traces: each client's speed and links, and when it is online.
  std::vector<DeviceTrace> traces;
  if (!config->local.trace.empty()) {
    auto t = ReadDeviceTraces(config->local.trace);
    if (!t.ok()) return fail(std::string(t.status().message()));
    traces = *std::move(t);
  }

  // Thousands of threads (one per client, waiting on its control stream) and the task
  // workers: smaller stacks than glibc's default 8 MiB keep the address space modest;
  // 1 MiB is far more than LibTorch's CPU kernels use on the workers.
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  pthread_setattr_default_np(&attr);
  pthread_attr_destroy(&attr);

  auto task_slots = std::make_shared<TaskSlots>(slots);
  auto heartbeats = std::make_shared<Heartbeats>();
  auto channel = (*server)->InProcessChannel();
  // A virtual client, started again from `options` when its trace brings it back online.
  struct Virtual {
    ClientOptions options;
    const DeviceTrace* trace = nullptr;
    std::unique_ptr<Client> client;
    std::thread thread;
    Status status;  // of its last Run
  };
  std::vector<Virtual> virtuals;
  virtuals.reserve(clients);
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
    const DeviceTrace* trace = traces.empty() ? nullptr : &traces[i % traces.size()];
    if (trace) {
      c.emulation = trace->device;
    } else if (!config->local.profiles.empty()) {
      c.emulation = config->local.profiles[i % config->local.profiles.size()];
      c.memory_limit_bytes = c.emulation.memory_limit_mb << 20;
    }
    if (config->local.attackers > 0 && i >= clients - config->local.attackers) {
      c.attack = config->local.attack;
    }
    c.task_slots = task_slots;
    c.heartbeats = heartbeats;
    // Gossip: the server stays in-process, but neighbours exchange models peer to peer,
    // each virtual client serving Peer on a loopback port of its own.
    if (config->scheduler.gossip()) c.peer_listen = "127.0.0.1:0";
    Virtual v;
    v.options = std::move(c);
    v.trace = trace;
    virtuals.push_back(std::move(v));
  }
  all = Dataset();  // each client holds its own part now
  int online_at_start = 0;
  for (const Virtual& v : virtuals) online_at_start += !v.trace || v.trace->OnlineAt(0);
  std::cout << "cleave simulate: " << config->run.name << ", " << virtuals.size()
            << " virtual clients in this process (" << examples << " examples";
  if (empty > 0) std::cout << "; " << empty << " got no examples and are left out";
  std::cout << "), " << config->run.rounds << " rounds, model " << config->model.name
            << ", strategy " << config->strategy.name << ", partition "
            << config->local.partition << ", " << slots << " task slots";
  if (!traces.empty()) {
    std::cout << ", trace " << config->local.trace << " (" << online_at_start
              << " online at start)";
  }
  std::cout << "\n" << std::flush;
  if (static_cast<int>(virtuals.size()) < config->clients.min_clients) {
    return fail(absl::StrCat("only ", virtuals.size(), " clients have data, below clients.min=",
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
  auto launch = [](Virtual& v) {
    v.client = std::make_unique<Client>(v.options);
    v.thread = std::thread([&v] { v.status = v.client->Run(); });
  };
  // Stops `stopping` together (each Stop is quick; the joins then overlap).
  auto halt = [](const std::vector<Virtual*>& stopping) {
    for (Virtual* v : stopping) v->client->Stop();
    for (Virtual* v : stopping) {
      v->thread.join();
      v->client.reset();
    }
  };
  for (Virtual& v : virtuals) {
    if (!v.trace || v.trace->OnlineAt(0)) launch(v);
  }
  RoundPrinter printer(run_dir, config->run.rounds);
  int64_t dropouts = 0, returns = 0;
  while (!server_done) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    printer.Drain();
    if (g_interrupted) (*server)->Stop();
    if (traces.empty()) continue;
    // Follow the trace: clients whose window closed leave (a dropout: their task, if
    // any, fails), clients whose window opened join again.
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<Virtual*> leaving;
    for (Virtual& v : virtuals) {
      const bool online = v.trace->OnlineAt(t);
      if (online && !v.client) {
        spdlog::info("trace: {} online at {:.1f}s", v.options.name, t);
        launch(v);
        ++returns;
      } else if (!online && v.client) {
        spdlog::info("trace: {} offline at {:.1f}s", v.options.name, t);
        leaving.push_back(&v);
        ++dropouts;
      }
    }
    halt(leaving);
  }
  server_thread.join();
  printer.Drain();
  // A completed run told its clients it ended; otherwise they would keep reconnecting.
  std::vector<Virtual*> running;
  for (Virtual& v : virtuals) {
    if (v.client) running.push_back(&v);
  }
  if (!result.ok()) {
    halt(running);
  } else {
    for (Virtual* v : running) v->thread.join();
  }
  int client_errors = 0;
  for (const Virtual& v : virtuals) {
    client_errors += !v.status.ok() && v.status.code() != absl::StatusCode::kCancelled;
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t peak = PeakRssBytes();
  virtuals.clear();  // before the server whose channel they hold
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
      Bytes(printer.total_up()), Bytes(printer.total_down()), Bytes(peak), clients - empty);
  if (!traces.empty()) {
    std::cout << "trace: " << dropouts << " dropouts, " << returns << " returns\n";
  }
  if (client_errors > 0) {
    std::cout << client_errors << " virtual client(s) ended with an error; see " << run_dir
              << "/simulate.log\n";
  }
  std::cout << "run directory: " << run_dir << " (metrics.jsonl, simulate.log, checkpoint.pb)\n";
  PrintReport(run_dir);
  return 0;
}

}  // namespace cleave
