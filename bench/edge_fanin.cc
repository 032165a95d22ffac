// Hierarchical aggregation's fan-in (issue 17): 1,000 light clients as one flat
// federation, then the same clients across 10 edge aggregators under one top
// coordinator, all in this process on in-process channels (the real Client and Server
// code paths, as `cleave simulate` runs them). Prints the top coordinator's transport
// bytes per round both ways and their ratio (the target: reduced by the fan-in, 100),
// each run's wall time, and how far apart the two final models are (the same clients,
// seeds and data: they must agree to float summation order).
//   ./build/bin/bench_edge_fanin [--clients 1000] [--edges 10] [--rounds 3]
#include <pthread.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client/shared.h"
#include "data/dataset.h"
#include "edge/edge.h"
#include "job/job.h"
#include "models/model.h"
#include "server/server.h"

namespace cleave {
namespace {

constexpr char kData[] = "fmnist:/usr/share/datasets/fashion-mnist";

JobConfig Config(const std::string& yaml) {
  auto c = ParseJob(yaml, ".");
  if (!c.ok()) {
    std::fprintf(stderr, "config: %s\n", std::string(c.status().message()).c_str());
    std::exit(2);
  }
  return *c;
}

std::unique_ptr<Server> InProcessServer(const JobConfig& config) {
  ServerOptions o;
  o.config = config;
  o.in_process_only = true;
  auto s = Server::Create(std::move(o));
  if (!s.ok() || !(*s)->Start().ok()) {
    std::fprintf(stderr, "server: %s\n", std::string(s.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(s);
}

struct Result {
  std::vector<RoundMetrics> top;
  ParameterSet model;
  double seconds = 0;
};

// Runs `clients` (options without a channel) under `top`, directly (edges = 0) or
// across `edges` edge servers made from `edge_config`.
Result Run(const JobConfig& top_config, const JobConfig& edge_config,
           std::vector<ClientOptions> clients, int edges) {
  const auto start = std::chrono::steady_clock::now();
  auto top = InProcessServer(top_config);
  Status top_status;
  std::thread top_thread([&] { top_status = top->Run(); });
  std::vector<std::unique_ptr<Server>> edge_servers;
  std::vector<std::unique_ptr<Edge>> edge_runs;
  std::vector<std::thread> threads;
  for (int e = 0; e < edges; ++e) {
    edge_servers.push_back(InProcessServer(edge_config));
    ClientOptions up;
    up.channel = top->InProcessChannel();
    up.server = "in-process";
    up.name = "edge-" + std::to_string(e);
    edge_runs.push_back(std::make_unique<Edge>(edge_servers.back().get(), std::move(up)));
  }
  auto slots = std::make_shared<TaskSlots>(2);
  auto beats = std::make_shared<Heartbeats>();
  std::vector<std::unique_ptr<Client>> running;
  for (size_t i = 0; i < clients.size(); ++i) {
    ClientOptions o = std::move(clients[i]);
    o.channel = edges ? edge_servers[i % edges]->InProcessChannel() : top->InProcessChannel();
    o.server = "in-process";
    o.task_slots = slots;
    o.heartbeats = beats;
    running.push_back(std::make_unique<Client>(std::move(o)));
  }
  for (auto& e : edge_runs) threads.emplace_back([&e] { (void)e->Run(); });
  for (auto& c : running) threads.emplace_back([&c] { (void)c->Run(); });
  top_thread.join();
  for (auto& t : threads) t.join();
  if (!top_status.ok()) {
    std::fprintf(stderr, "run failed: %s\n", top_status.ToString().c_str());
    std::exit(1);
  }
  Result r;
  r.top = top->History();
  r.model = top->GlobalModel();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

int Main(int argc, char** argv) {
  int clients = 1000, edges = 10, rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--clients")) clients = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--edges")) edges = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--rounds")) rounds = std::atoi(argv[i + 1]);
  }
  if (clients < edges || edges < 1 || rounds < 1) {
    std::fprintf(stderr, "need --clients >= --edges >= 1 and --rounds >= 1\n");
    return 2;
  }
  // Thousands of threads: small stacks (as cleave simulate).
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 1 << 20);
  pthread_setattr_default_np(&attr);
  pthread_attr_destroy(&attr);
  SetTorchThreads(1);
  spdlog::set_level(spdlog::level::warn);  // thousands of join lines otherwise
  const std::string common =
      "model: {name: mlp}\n"
      "train: {local_epochs: 1, batch_size: 10, lr: 0.05}\n"
      "server: {heartbeat_s: 15, client_timeout_s: 600}\n";
  const JobConfig flat = Config(common + "run: {rounds: " + std::to_string(rounds) +
                                ", seed: 3}\ndata: {test: \"\"}\n"
                                "clients: {min: " + std::to_string(clients) +
                                ", quorum: 1.0, round_deadline_s: 3600, join_timeout_s: 600}\n");
  const JobConfig top = Config(common + "run: {rounds: " + std::to_string(rounds) +
                               ", seed: 3}\ndata: {test: \"\"}\n"
                               "clients: {min: " + std::to_string(edges) +
                               ", quorum: 1.0, round_deadline_s: 3600, join_timeout_s: 600}\n");
  const JobConfig edge = Config(common + "data: {test: \"\"}\nclients: {min: " +
                                std::to_string(clients / edges) +
                                ", quorum: 1.0, round_deadline_s: 3600, join_timeout_s: 600}\n");
  // LEAF-style light clients: six training examples each.
  auto all = LoadDataSpec(std::string(kData) + ",limit=" + std::to_string(6 * clients), true);
  if (!all.ok()) {
    std::fprintf(stderr, "%s\n", std::string(all.status().message()).c_str());
    return 1;
  }
  auto make_clients = [&] {
    std::vector<ClientOptions> out;
    for (int i = 0; i < clients; ++i) {
      std::vector<int64_t> idx;
      for (int j = 0; j < 6; ++j) idx.push_back(6 * i + j);
      ClientOptions o;
      o.name = "light-" + std::to_string(i);
      o.train = all->Subset(idx);
      out.push_back(std::move(o));
    }
    return out;
  };
  std::printf("%d clients, %d rounds: flat, then across %d edge aggregators\n", clients, rounds,
              edges);
  const Result a = Run(flat, edge, make_clients(), 0);
  const Result b = Run(top, edge, make_clients(), edges);
  double up_a = 0, down_a = 0, up_b = 0, down_b = 0;
  for (const auto& m : a.top) up_a += m.bytes_up, down_a += m.bytes_down;
  for (const auto& m : b.top) up_b += m.bytes_up, down_b += m.bytes_down;
  const double n = rounds;
  std::printf("flat:    top coordinator %.1f MB up + %.1f MB down a round, %d participants, %.1f s\n",
              up_a / n / 1e6, down_a / n / 1e6, a.top.back().participants, a.seconds);
  std::printf("2-level: top coordinator %.2f MB up + %.2f MB down a round, %d participants, %.1f s\n",
              up_b / n / 1e6, down_b / n / 1e6, b.top.back().participants, b.seconds);
  std::printf("top traffic flat / 2-level: %.1fx (fan-in %d)\n", (up_a + down_a) / (up_b + down_b),
              clients / edges);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.model.size(); ++i) {
    for (size_t j = 0; j < a.model.tensors()[i].values.size(); ++j) {
      diff = std::max(diff, double(std::abs(a.model.tensors()[i].values[j] -
                                            b.model.tensors()[i].values[j])));
      scale = std::max(scale, double(std::abs(a.model.tensors()[i].values[j])));
    }
  }
  std::printf("final models: max |flat - 2-level| = %.2e (largest |weight| %.3f)\n", diff, scale);
  return 0;
}

}  // namespace
}  // namespace cleave

int main(int argc, char** argv) { return cleave::Main(argc, argv); }
