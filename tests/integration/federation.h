// An in-process federation for tests: a server and clients over real gRPC on localhost.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "core/clock.h"
#include "data/dataset.h"
#include "models/model.h"
#include "server/server.h"
#include "tests/server/test_peer.h"

namespace cleave {

inline constexpr char kFmnist[] = "/usr/share/datasets/fashion-mnist";

inline std::vector<Dataset> ClientData(int clients, int64_t examples) {
  static Dataset all = *LoadFashionMnist(kFmnist, true, 6000);
  auto parts = Partition(std::vector<int64_t>(all.labels.begin(), all.labels.begin() + examples),
                         10, "iid", clients, 42);
  EXPECT_TRUE(parts.ok());
  std::vector<Dataset> out;
  for (const auto& p : *parts) out.push_back(all.Subset(p));
  return out;
}

struct Federation {
  std::unique_ptr<Server> server;
  std::thread server_thread;
  Status server_status;
  std::atomic<bool> server_done{false};  // set once Run() returned
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::thread> client_threads;
  std::vector<Status> client_status;
  // Where clients dial, given the server's port (default: the server itself).
  std::function<std::string(int port)> dial;
  // The server's clock. The default stands still: no round deadline or heartbeat timeout
  // passes, however slowly the machine (or a sanitizer) runs, unless a test moves it.
  std::shared_ptr<Clock> clock = std::make_shared<FakeClock>();
  // Clients reach the server through Server::InProcessChannel(): no port, no socket.
  bool in_process = false;
  // The global model before any round (set by Start).
  ParameterSet initial;

  void Start(const std::string& yaml, std::vector<ClientOptions> client_opts,
             const std::string& run_dir = "") {
    SetTorchThreads(1);
    ServerOptions o;
    o.config = TestConfig(yaml);
    o.listen = "127.0.0.1:0";
    o.run_dir = run_dir;
    o.insecure = true;
    o.in_process_only = in_process;
    o.clock = clock;
    auto s = Server::Create(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server = *std::move(s);
    initial = server->GlobalModel();
    ASSERT_TRUE(server->Start().ok());
    server_thread = std::thread([this] {
      server_status = server->Run();
      server_done = true;
    });
    client_status.resize(client_opts.size());
    for (size_t i = 0; i < client_opts.size(); ++i) {
      client_opts[i].server =
          dial ? dial(server->port()) : "127.0.0.1:" + std::to_string(server->port());
      client_opts[i].name = "client-" + std::to_string(i);
      client_opts[i].insecure = true;
      if (in_process) client_opts[i].channel = server->InProcessChannel();
      clients.push_back(std::make_unique<Client>(std::move(client_opts[i])));
    }
    for (size_t i = 0; i < clients.size(); ++i) {
      client_threads.emplace_back([this, i] { client_status[i] = clients[i]->Run(); });
    }
  }

  void Join() {
    if (server_thread.joinable()) server_thread.join();
    for (auto& t : client_threads) t.join();
    client_threads.clear();
  }

  ~Federation() {
    if (server) server->Stop();
    for (auto& c : clients) c->Stop();
    Join();
  }
};

// The uncut model `spec`'s parameters before and after training on `data` with `t`: the
// step a split or pipelined round must equal. Both empty when it fails (a test failure).
struct UncutStep {
  ParameterSet before, after;
};
inline UncutStep TrainUncut(const ModelSpec& spec, const Dataset& data, const LocalTrainOptions& t) {
  auto model = Model::Create(spec);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  UncutStep step;
  step.before = (*model)->Parameters();
  auto trained = (*model)->Train(data, t);
  EXPECT_TRUE(trained.ok()) << trained.status();
  if (!trained.ok()) return {};
  step.after = (*model)->Parameters();
  return step;
}

// The largest absolute difference between two sets of the same layout.
inline double MaxDiff(const ParameterSet& a, const ParameterSet& b) {
  EXPECT_TRUE(a.SameLayout(b));
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < a.tensors()[i].values.size(); ++j) {
      d = std::max<double>(d, std::abs(a.tensors()[i].values[j] - b.tensors()[i].values[j]));
    }
  }
  return d;
}

inline std::vector<ClientOptions> Options(int n, int64_t examples) {
  std::vector<ClientOptions> out;
  for (auto& d : ClientData(n, examples)) {
    ClientOptions o;
    o.train = std::move(d);
    out.push_back(std::move(o));
  }
  return out;
}

// Clients holding the `data_spec`'s training part, partitioned naturally (a text
// source's files, a folder's groups) among `n`.
inline std::vector<ClientOptions> NaturalClients(const std::string& data_spec, int n) {
  auto all = LoadDataSpec(data_spec, true);
  EXPECT_TRUE(all.ok()) << all.status();
  auto parts = PartitionDataset(*all, "natural", n, 1);
  EXPECT_TRUE(parts.ok()) << parts.status();
  std::vector<ClientOptions> out;
  for (const auto& p : *parts) {
    ClientOptions o;
    o.train = all->Subset(p);
    out.push_back(std::move(o));
  }
  return out;
}

// Runs a federation to its end and returns the server's metrics (the test fails if the
// run does not complete).
inline std::vector<RoundMetrics> RunToEnd(const std::string& yaml,
                                          std::vector<ClientOptions> clients) {
  Federation f;
  f.Start(yaml, std::move(clients));
  f.Join();
  EXPECT_TRUE(f.server_status.ok()) << f.server_status << "\n" << yaml;
  return f.server->History();
}

}  // namespace cleave
