// cleave-client: the edge binary.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>
#include <limits>
#include <thread>

#include "client/attacks.h"
#include "client/client.h"
#include "core/cli.h"
#include "core/http_endpoint.h"
#include "core/logging.h"
#include "core/memory.h"
#include "core/mutex.h"
#include "core/signals.h"
#include "models/model.h"
#include "privacy/tls.h"
#include "service/pool_member.h"
#include "service/site_policy.h"

namespace {

// The command line: the client's options it sets directly, and the rest.
struct Flags {
  cleave::ClientOptions client;
  std::string data_spec, partition, log_level = "info", log_format = "text";
  int torch_threads = 1;
  double holdout = 0;
  std::string token_file;
  int64_t memory_limit_mb = 0;
  int64_t buffer_cache_mb = -1;  // -1: 1024, or an eighth of --memory-limit-mb
  std::string metrics_listen;
  bool stay = false;
  std::vector<std::string> datasets;  // --dataset NAME=SPEC
  std::string site_policy;
};

// SplitGuard's flags (client/split_guard.h).
void AddSplitGuardFlags(CLI::App& app, Flags& f) {
  app.add_flag("--split-guard", f.client.split_guard.enabled,
               "SplitGuard: in sl and sfl split tasks, send fake micro-batches now and then and refuse a server "
               "whose gradients do not depend on the labels (training hijacking)");
  app.add_option("--split-guard-threshold", f.client.split_guard.threshold,
                 "the mean SplitGuard score under which the device refuses the server (default 0.6)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--split-guard-fake-rate", f.client.split_guard.fake_rate,
                 "the share of micro-batches sent as fakes after the warm-up (default 0.05)")
      ->check(CLI::Range(0.01, 0.5));
  app.add_option("--split-guard-fake-share", f.client.split_guard.fake_share,
                 "the share of a fake micro-batch's labels moved (default 0.5)")
      ->check(CLI::Range(0.05, 1.0));
}

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--server", f.client.server, "coordinator address HOST:PORT")->required();
  app.add_option("--data", f.data_spec,
                 "local data: SOURCE:PATH[,OPTION...], e.g. idx:DIR, folder:DIR,size=32, "
                 "csv:FILE,label=y (docs/configuration.md); with --stay, the dataset named default");
  app.add_option("--partition", f.partition,
                 "use one part of the data: SCHEME,client=I,of=N[,seed=S] with SCHEME iid, "
                 "dirichlet:A, shards:S, labels:K or natural (the data's own groups)");
  app.add_option("--holdout", f.holdout,
                 "keep this fraction of the local data to evaluate the global model on "
                 "(federated evaluation)")
      ->check(CLI::Range(0.0, 0.9));
  app.add_option("--state-dir", f.client.state_dir,
                 "keep this device's personal layers (model.personal) in DIR/personal.pb "
                 "across restarts");
  app.add_option("--keep-sent", f.client.keep_sent,
                 "keep the inputs and labels of each split task's first N micro-batches (a federated "
                 "task's first batch) in STATE_DIR/sent: the truth a privacy measurement scores the "
                 "server's attacks against")
      ->check(CLI::Range(0, 1000));
  AddSplitGuardFlags(app, f);
  app.add_option("--model-dir", f.client.model_dir,
                 "this device's copy of the model's Hugging Face folder (model hf): split "
                 "tasks read their stages' frozen weights from it instead of downloading them")
      ->check(CLI::ExistingDirectory);
  app.add_option("--name", f.client.name, "client name shown by the server (with --cert: its CN)");
  app.add_option("--ca", f.client.tls_ca,
                 "federation CA certificate: speak TLS and verify the server");
  app.add_option("--cert", f.client.tls_cert, "this client's certificate, for mutual TLS")
      ->needs("--ca");
  app.add_option("--key", f.client.tls_key, "this client's private key")->needs("--cert");
  app.add_flag("--insecure", f.client.insecure, "talk to the server in plaintext (no --ca)")
      ->excludes("--ca");
  app.add_option("--token-file", f.token_file,
                 "bearer token to present on every call (the server's auth.token_file)")
      ->needs("--ca");
  app.add_option("--attack", f.client.attack,
                 "simulate an attacker (experiments): " + cleave::AttackNames().List())
      ->check(CLI::IsMember(cleave::AttackNames().names));
  app.add_option("--torch-threads", f.torch_threads, "LibTorch intra-op threads (default 1)")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--stay", f.stay,
               "attach to a daemon's pool (cleave-server --daemon; --server is its --clients-listen) and run "
               "every job it offers that the site policy accepts; never give up reaching it unless "
               "--give-up-after says so");
  app.add_option("--dataset", f.datasets,
                 "with --stay: expose local data under a name jobs use (data.dataset): NAME=SPEC, SPEC as "
                 "--data's; repeat for several")
      ->needs("--stay");
  app.add_option("--site-policy", f.site_policy,
                 "with --stay: the site policy file, which jobs this device accepts (docs/operators.md)")
      ->needs("--stay");
  app.add_option("--give-up-after", f.client.give_up_after_s,
                 "seconds without reaching the server");
  cleave::AddLogOptions(app, &f.log_level, &f.log_format);
  app.add_option("--emulate-uplink-mbps", f.client.emulation.uplink_mbps,
                 "emulate an uplink of this many Mbit/s (token bucket; 0 = off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--emulate-downlink-mbps", f.client.emulation.downlink_mbps,
                 "emulate a downlink of this many Mbit/s (0 = off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--emulate-slowdown", f.client.emulation.slowdown,
                 "emulate a device this many times slower at computing (>= 1)")
      ->check(CLI::Range(1.0, 1000.0));
  app.add_option("--peer-listen", f.client.peer_listen,
                 "serve the Peer service on HOST:PORT (port 0 picks one) to take part in "
                 "gossip rounds (scheduler.mode: gossip)");
  app.add_option("--peer-advertise", f.client.peer_advertise,
                 "the HOST:PORT neighbours dial (default: --peer-listen's host, bound port)")
      ->needs("--peer-listen");
  app.add_option("--memory-limit-mb", f.memory_limit_mb,
                 "memory this client may use; what is left for training goes to the server's cut choice (0 = no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--buffer-cache-mb", f.buffer_cache_mb,
                 "keep up to this many MiB of LibTorch's freed large buffers for the next "
                 "training step (0 = none; default 1024, or an eighth of --memory-limit-mb)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--metrics-listen", f.metrics_listen,
                 "serve this device's /metrics (Prometheus) on HOST:PORT: plain HTTP on a "
                 "loopback address, else HTTPS with --cert/--key");
}

// Local data of `spec`: its partition (only this client's part read where the source
// can), and the held-out part.
cleave::StatusOr<cleave::PoolMemberOptions::Data> LoadData(const Flags& f, const std::string& spec) {
  cleave::PartFilter part;
  if (!f.partition.empty()) {
    ASSIGN_OR_RETURN(part, cleave::PartitionFilter(f.partition));
  }
  cleave::PoolMemberOptions::Data d;
  ASSIGN_OR_RETURN(d.train, cleave::LoadDataSpecPart(spec, /*train=*/true, part));
  d.holdout = cleave::TakeHoldout(&d.train, f.holdout, /*seed=*/7);
  spdlog::info("{}: {} local training examples{}; {} MiB resident (peak {} MiB)", spec, d.train.size,
               d.holdout.size > 0 ? ", " + std::to_string(d.holdout.size) + " held out" : "",
               cleave::ResidentBytes() >> 20, cleave::PeakResidentBytes() >> 20);
  return d;
}

// --stay: the datasets exposed (--data as "default", each --dataset NAME=SPEC) and the
// site policy.
cleave::StatusOr<cleave::PoolMemberOptions> MakePoolOptions(const Flags& f, cleave::ClientOptions client) {
  cleave::PoolMemberOptions o;
  if (!f.site_policy.empty()) {
    ASSIGN_OR_RETURN(o.policy, cleave::LoadSitePolicy(f.site_policy));
  }
  std::vector<std::pair<std::string, std::string>> specs;
  if (!f.data_spec.empty()) specs.emplace_back("default", f.data_spec);
  for (const std::string& d : f.datasets) {
    const size_t eq = d.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == d.size()) {
      return absl::InvalidArgumentError("--dataset " + d + ": NAME=SPEC");
    }
    specs.emplace_back(d.substr(0, eq), d.substr(eq + 1));
  }
  if (specs.empty()) return absl::InvalidArgumentError("--stay needs --data or --dataset NAME=SPEC");
  for (const auto& [name, spec] : specs) {
    if (o.datasets.count(name) > 0) return absl::InvalidArgumentError("dataset " + name + " given twice");
    auto data = LoadData(f, spec);
    if (!data.ok()) return absl::InvalidArgumentError("dataset " + name + ": " + std::string(data.status().message()));
    o.datasets[name] = *std::move(data);
  }
  o.client = std::move(client);
  return o;
}

// The client's options from the command line (messages for the operator on errors).
cleave::StatusOr<cleave::ClientOptions> MakeOptions(const Flags& f) {
  cleave::ClientOptions opts = f.client;
  if (!f.token_file.empty()) {
    auto token = cleave::ReadBearerToken(f.token_file);
    if (!token.ok()) {
      return absl::InvalidArgumentError("--token-file: " + std::string(token.status().message()));
    }
    opts.token = *token;
  }
  if (!f.stay) {
    if (f.data_spec.empty()) return absl::InvalidArgumentError("--data is required (the local training data)");
    ASSIGN_OR_RETURN(cleave::PoolMemberOptions::Data data, LoadData(f, f.data_spec));
    opts.train = std::move(data.train);
    opts.holdout = std::move(data.holdout);
  }
  if (opts.keep_sent > 0 && opts.state_dir.empty()) {
    return absl::InvalidArgumentError("--keep-sent keeps what was sent under --state-dir: give one");
  }
  if (!opts.state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opts.state_dir, ec);
    if (ec) {
      return absl::InvalidArgumentError("--state-dir " + opts.state_dir + ": " + ec.message());
    }
  }
  opts.memory_limit_bytes = f.memory_limit_mb << 20;
  return opts;
}

// The client of one run or, with --stay, the pool member that runs a client per job.
class Runs {
 public:
  cleave::Status Run(cleave::ClientOptions opts) {
    auto client = std::make_unique<cleave::Client>(std::move(opts));
    return Running(client.get(), &client_, [&] { return client->Run(); });
  }
  cleave::Status Run(cleave::PoolMemberOptions opts) {
    auto member = std::make_unique<cleave::PoolMember>(std::move(opts));
    return Running(member.get(), &member_, [&] { return member->Run(); });
  }
  void Stop() {
    cleave::MutexLock l(&mu_);
    stopped_ = true;
    if (client_ != nullptr) client_->Stop();
    if (member_ != nullptr) member_->Stop();
  }
  // The running client's Prometheus text; empty when none runs.
  std::string MetricsText() {
    cleave::MutexLock l(&mu_);
    if (client_ != nullptr) return cleave::ClientMetricsText(client_->State());
    return member_ != nullptr ? member_->MetricsText() : "";
  }

 private:
  // Runs `run` with `*slot` set to `runner` meanwhile (so that Stop reaches it).
  template <typename T, typename F>
  cleave::Status Running(T* runner, T** slot, F run) {
    {
      cleave::MutexLock l(&mu_);
      if (stopped_) return absl::CancelledError("stopped");
      *slot = runner;
    }
    cleave::Status s = run();
    cleave::MutexLock l(&mu_);
    *slot = nullptr;
    return s;
  }

  cleave::Mutex mu_;
  cleave::Client* client_ ABSL_GUARDED_BY(mu_) = nullptr;
  cleave::PoolMember* member_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

// --metrics-listen: the device's /metrics, of whichever client is running.
cleave::StatusOr<std::unique_ptr<cleave::HttpEndpoint>> StartMetrics(const Flags& f, Runs& runs) {
  std::map<std::string, cleave::HttpEndpoint::Page> pages;
  pages["/metrics"] = {"text/plain; version=0.0.4; charset=utf-8", [&runs] { return runs.MetricsText(); }};
  ASSIGN_OR_RETURN(auto endpoint,
                   cleave::HttpEndpoint::Start("--metrics-listen", f.metrics_listen, f.client.tls_cert,
                                               f.client.tls_key, "--cert and --key", std::move(pages)));
  spdlog::info("device metrics: {}://{}:{}/metrics", endpoint->https() ? "https" : "http", endpoint->host(),
               endpoint->port());
  return endpoint;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cleave-client: a federated-learning edge client"};
  Flags f;
  AddFlags(app, f);
  if (int rc = cleave::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (f.stay && app.count("--give-up-after") == 0) {
    f.client.give_up_after_s = std::numeric_limits<double>::infinity();
  }
  if (f.client.tls_cert.empty() != f.client.tls_key.empty()) {
    std::cerr << "--cert and --key go together\n";
    return 2;
  }
  if (f.client.tls_ca.empty() && !f.client.insecure) {
    std::cerr << "cleave-client: give --ca (the federation CA) to talk TLS, or --insecure for "
                 "plaintext\n";
    return 2;
  }
  const std::string& name = f.client.name;
  if (auto s = cleave::SetupLogging(name.empty() ? "client" : name, "", f.log_level, "",
                                    f.log_format);
      !s.ok()) {
    std::cerr << "cleave-client: " << s.message() << "\n";
    return 2;
  }
  cleave::SetTorchBufferCache(f.buffer_cache_mb >= 0     ? f.buffer_cache_mb << 20
                              : f.memory_limit_mb > 0 ? (f.memory_limit_mb << 20) / 8
                                                      : cleave::kTorchBufferCacheBytes);
  cleave::SetTorchThreads(f.torch_threads);
  auto opts = MakeOptions(f);
  if (!opts.ok()) {
    std::cerr << "cleave-client: " << opts.status().message() << "\n";
    return 2;
  }
  const cleave::DeviceEmulation& e = f.client.emulation;
  if (e.slowdown > 1 || e.uplink_mbps > 0 || e.downlink_mbps > 0) {
    spdlog::info("emulating a device: compute slowdown {}x, uplink {} Mbit/s, downlink {} "
                 "Mbit/s (0 = not limited)",
                 e.slowdown, e.uplink_mbps, e.downlink_mbps);
  }
  if (!f.client.attack.empty()) {
    spdlog::warn("--attack {}: this client sends malicious updates", f.client.attack);
  }
  if (f.client.insecure) spdlog::warn("--insecure: talking to the server in plaintext");
  Runs runs;
  std::unique_ptr<cleave::HttpEndpoint> metrics;
  if (!f.metrics_listen.empty()) {
    auto endpoint = StartMetrics(f, runs);
    if (!endpoint.ok()) {
      std::cerr << "cleave-client: " << endpoint.status().message() << "\n";
      return 2;
    }
    metrics = *std::move(endpoint);
  }
  cleave::Status s;
  {
    cleave::SignalWatcher signals([&runs](int) { runs.Stop(); });
    if (f.stay) {
      auto pool = MakePoolOptions(f, *std::move(opts));
      if (!pool.ok()) {
        std::cerr << "cleave-client: " << pool.status().message() << "\n";
        return 2;
      }
      s = runs.Run(*std::move(pool));
    } else {
      s = runs.Run(*std::move(opts));
    }
  }
  if (!s.ok()) {
    spdlog::error("{}", s.ToString());
    return s.code() == absl::StatusCode::kCancelled ? 130 : 1;
  }
  return 0;
}
