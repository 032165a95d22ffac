// cleave-client: the edge binary.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>
#include <thread>

#include "client/client.h"
#include "core/cli.h"
#include "core/http_endpoint.h"
#include "core/logging.h"
#include "privacy/tls.h"
#include "core/signals.h"
#include "models/model.h"

int main(int argc, char** argv) {
  CLI::App app{"cleave-client: a federated-learning edge client"};
  std::string server, data_spec, partition, name, log_level = "info", log_format = "text";
  int torch_threads = 1;
  double give_up_after = 600;
  app.add_option("--server", server, "coordinator address HOST:PORT")->required();
  app.add_option("--data", data_spec,
                 "local data: SOURCE:PATH[,OPTION...], e.g. idx:DIR, folder:DIR,size=32, "
                 "csv:FILE,label=y (docs/configuration.md)")
      ->required();
  app.add_option("--partition", partition,
                 "use one part of the data: SCHEME,client=I,of=N[,seed=S] with SCHEME iid, "
                 "dirichlet:A, shards:S, labels:K or natural (the data's own groups)");
  double holdout = 0;
  app.add_option("--holdout", holdout,
                 "keep this fraction of the local data to evaluate the global model on "
                 "(federated evaluation)")
      ->check(CLI::Range(0.0, 0.9));
  std::string state_dir;
  app.add_option("--state-dir", state_dir,
                 "keep this device's personal layers (model.personal) in DIR/personal.pb "
                 "across restarts");
  app.add_option("--name", name, "client name shown by the server (with --cert: its CN)");
  std::string tls_ca, tls_cert, tls_key;
  app.add_option("--ca", tls_ca, "federation CA certificate: speak TLS and verify the server");
  app.add_option("--cert", tls_cert, "this client's certificate, for mutual TLS")->needs("--ca");
  app.add_option("--key", tls_key, "this client's private key")->needs("--cert");
  bool insecure = false;
  std::string token_file;
  app.add_flag("--insecure", insecure, "talk to the server in plaintext (no --ca)")
      ->excludes("--ca");
  app.add_option("--token-file", token_file,
                 "bearer token to present on every call (the server's auth.token_file)")
      ->needs("--ca");
  std::string attack;
  app.add_option("--attack", attack,
                 "simulate an attacker (experiments): " + cleave::AttackNames().List())
      ->check(CLI::IsMember(cleave::AttackNames().names));
  app.add_option("--torch-threads", torch_threads, "LibTorch intra-op threads (default 1)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--give-up-after", give_up_after, "seconds without reaching the server");
  cleave::AddLogOptions(app, &log_level, &log_format);
  cleave::DeviceEmulation emulation;
  int64_t memory_limit_mb = 0;
  app.add_option("--emulate-uplink-mbps", emulation.uplink_mbps,
                 "emulate an uplink of this many Mbit/s (token bucket; 0 = off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--emulate-downlink-mbps", emulation.downlink_mbps,
                 "emulate a downlink of this many Mbit/s (0 = off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--emulate-slowdown", emulation.slowdown,
                 "emulate a device this many times slower at computing (>= 1)")
      ->check(CLI::Range(1.0, 1000.0));
  std::string peer_listen, peer_advertise;
  app.add_option("--peer-listen", peer_listen,
                 "serve the Peer service on HOST:PORT (port 0 picks one) to take part in "
                 "gossip rounds (scheduler.mode: gossip)");
  app.add_option("--peer-advertise", peer_advertise,
                 "the HOST:PORT neighbours dial (default: --peer-listen's host, bound port)")
      ->needs("--peer-listen");
  app.add_option("--memory-limit-mb", memory_limit_mb,
                 "memory training may use here, for the server's cut choice (0 = no limit)")
      ->check(CLI::NonNegativeNumber);
  std::string metrics_listen;
  app.add_option("--metrics-listen", metrics_listen,
                 "serve this device's /metrics (Prometheus) on HOST:PORT: plain HTTP on a "
                 "loopback address, else HTTPS with --cert/--key");
  if (int rc = cleave::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (tls_cert.empty() != tls_key.empty()) {
    std::cerr << "--cert and --key go together\n";
    return 2;
  }
  if (tls_ca.empty() && !insecure) {
    std::cerr << "cleave-client: give --ca (the federation CA) to talk TLS, or --insecure for "
                 "plaintext\n";
    return 2;
  }
  std::string token;
  if (!token_file.empty()) {
    auto read = cleave::ReadBearerToken(token_file);
    if (!read.ok()) {
      std::cerr << "cleave-client: --token-file: " << read.status().message() << "\n";
      return 2;
    }
    token = *read;
  }

  if (auto s = cleave::SetupLogging(name.empty() ? "client" : name, "", log_level, "", log_format); !s.ok()) {
    std::cerr << "cleave-client: " << s.message() << "\n";
    return 2;
  }
  cleave::SetTorchThreads(torch_threads);
  auto data = cleave::LoadDataSpec(data_spec, /*train=*/true);
  if (!data.ok()) {
    std::cerr << "cleave-client: " << data.status().message() << "\n";
    return 2;
  }
  if (!partition.empty()) {
    if (auto s = cleave::TakePartition(partition, &*data); !s.ok()) {
      std::cerr << "cleave-client: " << s.message() << "\n";
      return 2;
    }
  }
  cleave::Dataset held_out = cleave::TakeHoldout(&*data, holdout, /*seed=*/7);
  spdlog::info("{} local training examples{}", data->size,
               held_out.size > 0 ? ", " + std::to_string(held_out.size) + " held out" : "");

  cleave::ClientOptions opts;
  opts.server = server;
  opts.name = name;
  opts.peer_listen = peer_listen;
  opts.peer_advertise = peer_advertise;
  opts.train = *std::move(data);
  opts.holdout = std::move(held_out);
  if (!state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(state_dir, ec);
    if (ec) {
      std::cerr << "cleave-client: --state-dir " << state_dir << ": " << ec.message() << "\n";
      return 2;
    }
    opts.state_dir = state_dir;
  }
  opts.give_up_after_s = give_up_after;
  opts.emulation = emulation;
  if (emulation.slowdown > 1 || emulation.uplink_mbps > 0 || emulation.downlink_mbps > 0) {
    spdlog::info("emulating a device: compute slowdown {}x, uplink {} Mbit/s, downlink {} "
                 "Mbit/s (0 = not limited)",
                 emulation.slowdown, emulation.uplink_mbps, emulation.downlink_mbps);
  }
  opts.memory_limit_bytes = memory_limit_mb << 20;
  opts.tls_ca = tls_ca;
  opts.tls_cert = tls_cert;
  opts.tls_key = tls_key;
  opts.insecure = insecure;
  opts.attack = attack;
  if (!attack.empty()) spdlog::warn("--attack {}: this client sends malicious updates", attack);
  opts.token = token;
  if (insecure) spdlog::warn("--insecure: talking to the server in plaintext");
  cleave::Client client(std::move(opts));
  std::unique_ptr<cleave::HttpEndpoint> metrics;
  if (!metrics_listen.empty()) {
    std::map<std::string, cleave::HttpEndpoint::Page> pages;
    pages["/metrics"] = {"text/plain; version=0.0.4; charset=utf-8",
                         [&client] { return cleave::ClientMetricsText(client.State()); }};
    auto e = cleave::HttpEndpoint::Start("--metrics-listen", metrics_listen, tls_cert, tls_key,
                                         "--cert and --key", std::move(pages));
    if (!e.ok()) {
      std::cerr << "cleave-client: " << e.status().message() << "\n";
      return 2;
    }
    metrics = *std::move(e);
    spdlog::info("device metrics: {}://{}:{}/metrics", metrics->https() ? "https" : "http",
                 metrics->host(), metrics->port());
  }
  cleave::Status s;
  {
    cleave::SignalWatcher signals([&](int) { client.Stop(); });
    s = client.Run();
  }
  if (!s.ok()) {
    spdlog::error("{}", s.ToString());
    return s.code() == absl::StatusCode::kCancelled ? 130 : 1;
  }
  return 0;
}
