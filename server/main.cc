// cleave-server: the coordinator daemon.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <filesystem>
#include <iostream>
#include <thread>

#include "core/cli.h"
#include "core/files.h"
#include "core/logging.h"
#include "core/signals.h"
#include "models/model.h"
#include "server/edge.h"
#include "server/server.h"
#include "job/job.h"

int main(int argc, char** argv) {
  CLI::App app{"cleave-server: the federated-learning coordinator"};
  std::string config_path, listen, run_dir, log_level = "info", log_format = "text";
  int64_t rounds = 0;
  int torch_threads = 1;
  bool insecure = false;
  std::string tls_cert, tls_key, tls_ca;
  app.add_option("--config", config_path, "job config (YAML)")->required();
  app.add_option("--listen", listen, "address to listen on (default: server.listen)");
  app.add_option("--run-dir", run_dir, "run directory (default: runs/<run.name>)");
  app.add_option("--rounds", rounds, "override run.rounds")->check(cleave::AtLeastOne());
  app.add_option("--tls-cert", tls_cert, "override tls.cert (server certificate chain)");
  app.add_option("--tls-key", tls_key, "override tls.key")->needs("--tls-cert");
  app.add_option("--tls-ca", tls_ca, "override tls.ca (the CA client certificates chain to)");
  app.add_flag("--insecure", insecure, "serve plaintext when no certificate is configured");
  std::string upstream, upstream_ca, upstream_cert, upstream_key, upstream_name;
  bool upstream_insecure = false;
  app.add_option("--upstream", upstream,
                 "run as an edge aggregator: join this coordinator (HOST:PORT) as one client "
                 "and hand up this server's rounds");
  app.add_option("--upstream-ca", upstream_ca, "the upstream's CA (PEM)")->needs("--upstream");
  app.add_option("--upstream-cert", upstream_cert, "this edge's certificate for mutual TLS upstream")
      ->needs("--upstream");
  app.add_option("--upstream-key", upstream_key, "its key")->needs("--upstream-cert");
  app.add_option("--upstream-name", upstream_name, "the name shown upstream (default: the certificate's CN, else run.name)")
      ->needs("--upstream");
  app.add_flag("--upstream-insecure", upstream_insecure, "reach the upstream in plaintext")
      ->needs("--upstream");
  app.add_option("--torch-threads", torch_threads, "LibTorch threads for evaluation")
      ->check(CLI::Range(1, 1024));
  cleave::AddLogOptions(app, &log_level, &log_format);
  if (int rc = cleave::ParseCommandLine(app, argc, argv); rc >= 0) return rc;

  auto config = cleave::LoadJob(config_path);
  if (!config.ok()) {
    std::cerr << "cleave-server: " << config.status().message() << "\n";
    return 2;
  }
  if (rounds > 0) config->run.rounds = rounds;
  if (!tls_cert.empty()) {
    config->tls.cert = tls_cert;
    config->tls.key = tls_key;
  }
  if (!tls_ca.empty()) config->tls.ca = tls_ca;
  if (tls_cert.empty() != tls_key.empty()) {
    std::cerr << "cleave-server: --tls-cert and --tls-key go together\n";
    return 2;
  }
  if (insecure && !config->tls.cert.empty()) {
    std::cerr << "cleave-server: --insecure with a TLS certificate configured; drop one\n";
    return 2;
  }
  {
    // Connections cost descriptors: use all the hard limit allows (sessions are capped
    // below it, see server.max_sessions).
    rlimit r{};
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
      r.rlim_cur = r.rlim_max;
      setrlimit(RLIMIT_NOFILE, &r);
    }
  }
  if (!upstream.empty()) {
    if (auto s = cleave::CheckEdgeConfig(*config); !s.ok()) {
      std::cerr << "cleave-server: " << s.message() << "\n";
      return 2;
    }
    if (upstream_insecure == !upstream_ca.empty()) {
      std::cerr << "cleave-server: --upstream needs --upstream-ca or --upstream-insecure (one)\n";
      return 2;
    }
  }
  if (run_dir.empty()) run_dir = "runs/" + config->run.name;
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) {
    std::cerr << "cleave-server: cannot create " << run_dir << ": " << ec.message() << "\n";
    return 2;
  }
  if (auto s = cleave::SetupLogging("server", run_dir + "/server.log", log_level, "", log_format); !s.ok()) {
    std::cerr << "cleave-server: " << s.message() << "\n";
    return 2;
  }
  cleave::SetTorchThreads(torch_threads);

  cleave::ServerOptions opts;
  opts.config = *config;
  opts.listen = listen;
  opts.run_dir = run_dir;
  opts.insecure = insecure;
  opts.config_text = cleave::ReadFile(config_path).value_or("");
  auto server = cleave::Server::Create(std::move(opts));
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  if (auto s = (*server)->Start(); !s.ok()) {
    spdlog::error("{}", s.ToString());
    return 1;
  }
  cleave::Status status;
  if (!upstream.empty()) {
    cleave::ClientOptions up;
    up.server = upstream;
    // With a certificate the upstream names the edge after it (a Join name must match).
    up.name = !upstream_name.empty() ? upstream_name
              : upstream_cert.empty() ? config->run.name
                                      : "";
    up.insecure = upstream_insecure;
    up.tls_ca = upstream_ca;
    up.tls_cert = upstream_cert;
    up.tls_key = upstream_key;
    cleave::Edge edge(server->get(), std::move(up));
    cleave::SignalWatcher signals([&](int sig) {
      spdlog::warn("signal {}: stopping the edge aggregator", sig);
      edge.Stop();
    });
    status = edge.Run();
  } else {
    cleave::SignalWatcher signals([&](int sig) {
      spdlog::warn("signal {}: stopping (the last committed round stays in the checkpoint)", sig);
      (*server)->Stop();
    });
    status = (*server)->Run();
  }
  if (!status.ok()) {
    spdlog::error("run ended: {}", status.ToString());
    return status.code() == absl::StatusCode::kCancelled ? 130 : 1;
  }
  spdlog::info("run completed: {} rounds; run directory {}", (*server)->committed_round(), run_dir);
  return 0;
}
