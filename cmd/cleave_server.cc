// cleave-server: the coordinator daemon.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "core/cli.h"
#include "core/files.h"
#include "core/logging.h"
#include "core/signals.h"
#include "edge/edge.h"
#include "job/job.h"
#include "models/model.h"
#include "server/server.h"
#include "service/daemon.h"

namespace {

// The command line.
struct Flags {
  std::string config_path, listen, run_dir, log_level = "info", log_format = "text";
  int64_t rounds = 0;
  int torch_threads = 1;
  bool insecure = false;
  std::string tls_cert, tls_key, tls_ca;
  std::string upstream, upstream_ca, upstream_cert, upstream_key, upstream_name;
  bool upstream_insecure = false;
  // --daemon: a long-running server of submitted jobs.
  bool daemon = false;
  std::string state_dir, clients_listen, policy;
  int max_queued = 100;
  bool paused = false;
  std::string metrics_listen;
  std::string scheduler = "fifo", advertise_host, job_ports;
  int max_running = 4;
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--config", f.config_path, "job config (YAML): run this one job and exit");
  app.add_flag("--daemon", f.daemon,
               "run until stopped, serving the job API on --listen and the pool of long-lived clients "
               "(cleave-client --stay) on --clients-listen (docs/operators.md)")
      ->excludes("--config");
  app.add_option("--state-dir", f.state_dir, "--daemon: the job database and the jobs' run directories")
      ->needs("--daemon");
  app.add_option("--clients-listen", f.clients_listen,
                 "--daemon: the clients' pool (HOST:PORT); each running job serves its clients on this host, "
                 "on a port of its own")
      ->needs("--daemon");
  app.add_option("--advertise-host", f.advertise_host,
                 "--daemon: the host clients dial for a job's port (default: the host they dialed for the pool)")
      ->needs("--daemon");
  app.add_option("--job-ports", f.job_ports,
                 "--daemon: LO-HI, the ports running jobs serve their clients on (each job the lowest free one; "
                 "default: any free port)")
      ->needs("--daemon");
  app.add_option("--scheduler", f.scheduler,
                 "--daemon: how the pool's clients are divided among running jobs: fifo (run.priority, then "
                 "submission), fair (equal shares) or goodput (by measured client speed and update noise)")
      ->needs("--daemon")
      ->check(CLI::IsMember({"fifo", "fair", "goodput"}));
  app.add_option("--max-running", f.max_running, "--daemon: the most jobs running at once (default 4)")
      ->needs("--daemon")
      ->check(CLI::Range(1, 1000));
  app.add_option("--policy", f.policy, "--daemon: who may submit, read, cancel (YAML, re-read when it changes)")
      ->needs("--daemon");
  app.add_option("--max-queued", f.max_queued, "--daemon: the most jobs waiting at once")
      ->needs("--daemon")
      ->check(CLI::Range(1, 100000));
  app.add_flag("--paused", f.paused, "--daemon: accept and queue jobs but start none (maintenance)")
      ->needs("--daemon");
  app.add_option("--metrics-listen", f.metrics_listen,
                 "--daemon: serve /metrics (Prometheus: every job's state, rounds, accuracy, forecast end) "
                 "on HOST:PORT; HTTPS with --tls-cert off loopback")
      ->needs("--daemon");
  app.add_option("--listen", f.listen,
                 "address to listen on (default: server.listen; with --daemon the job API's)");
  app.add_option("--run-dir", f.run_dir, "run directory (default: runs/<run.name>)");
  app.add_option("--rounds", f.rounds, "override run.rounds")->check(cleave::AtLeastOne());
  app.add_option("--tls-cert", f.tls_cert, "override tls.cert (server certificate chain)");
  app.add_option("--tls-key", f.tls_key, "override tls.key")->needs("--tls-cert");
  app.add_option("--tls-ca", f.tls_ca, "override tls.ca (the CA client certificates chain to)");
  app.add_flag("--insecure", f.insecure, "serve plaintext when no certificate is configured");
  app.add_option("--upstream", f.upstream,
                 "run as an edge aggregator: join this coordinator (HOST:PORT) as one client "
                 "and hand up this server's rounds");
  app.add_option("--upstream-ca", f.upstream_ca, "the upstream's CA (PEM)")->needs("--upstream");
  app.add_option("--upstream-cert", f.upstream_cert, "this edge's certificate for mutual TLS upstream")
      ->needs("--upstream");
  app.add_option("--upstream-key", f.upstream_key, "its key")->needs("--upstream-cert");
  app.add_option("--upstream-name", f.upstream_name,
                 "the name shown upstream (default: the certificate's CN, else run.name)")
      ->needs("--upstream");
  app.add_flag("--upstream-insecure", f.upstream_insecure, "reach the upstream in plaintext")
      ->needs("--upstream");
  app.add_option("--torch-threads", f.torch_threads, "LibTorch threads for evaluation")
      ->check(CLI::Range(1, 1024));
  cleave::AddLogOptions(app, &f.log_level, &f.log_format);
}

// The job with the command line's overrides, checked together.
cleave::StatusOr<cleave::JobConfig> LoadConfig(const Flags& f) {
  ASSIGN_OR_RETURN(cleave::JobConfig config, cleave::LoadJob(f.config_path));
  if (f.rounds > 0) config.run.rounds = f.rounds;
  if (!f.tls_cert.empty()) {
    config.tls.cert = f.tls_cert;
    config.tls.key = f.tls_key;
  }
  if (!f.tls_ca.empty()) config.tls.ca = f.tls_ca;
  if (f.tls_cert.empty() != f.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (f.insecure && !config.tls.cert.empty()) {
    return absl::InvalidArgumentError("--insecure with a TLS certificate configured; drop one");
  }
  if (!f.upstream.empty()) {
    RETURN_IF_ERROR(cleave::CheckEdgeConfig(config));
    if (f.upstream_insecure == !f.upstream_ca.empty()) {
      return absl::InvalidArgumentError(
          "--upstream needs --upstream-ca or --upstream-insecure (one)");
    }
  }
  return config;
}

// Connections cost descriptors: use all the hard limit allows (sessions are capped
// below it, see server.max_sessions).
void RaiseDescriptorLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

// Runs the started server: its own rounds, or an edge's for the upstream.
cleave::Status RunServer(cleave::Server& server, const Flags& f, const cleave::JobConfig& config) {
  if (f.upstream.empty()) {
    cleave::SignalWatcher signals([&](int sig) {
      spdlog::warn("signal {}: stopping (the last committed round stays in the checkpoint)", sig);
      server.Stop();
    });
    return server.Run();
  }
  cleave::ClientOptions up;
  up.server = f.upstream;
  // With a certificate the upstream names the edge after it (a Join name must match).
  up.name = !f.upstream_name.empty() ? f.upstream_name
            : f.upstream_cert.empty() ? config.run.name
                                      : "";
  up.insecure = f.upstream_insecure;
  up.tls_ca = f.upstream_ca;
  up.tls_cert = f.upstream_cert;
  up.tls_key = f.upstream_key;
  cleave::Edge edge(&server, std::move(up));
  cleave::SignalWatcher signals([&](int sig) {
    spdlog::warn("signal {}: stopping the edge aggregator", sig);
    edge.Stop();
  });
  return edge.Run();
}

}  // namespace

// --daemon: runs submitted jobs until a signal stops it.
int RunDaemon(const Flags& f) {
  std::error_code ec;
  if (!f.state_dir.empty()) std::filesystem::create_directories(f.state_dir, ec);
  if (auto s = cleave::SetupLogging("daemon", f.state_dir.empty() ? "" : f.state_dir + "/daemon.log",
                                    f.log_level, "", f.log_format);
      !s.ok()) {
    std::cerr << "cleave-server: " << s.message() << "\n";
    return 2;
  }
  cleave::SetTorchThreads(f.torch_threads);
  RaiseDescriptorLimit();
  cleave::DaemonOptions o;
  o.state_dir = f.state_dir;
  o.listen = f.listen.empty() ? "0.0.0.0:7071" : f.listen;
  o.clients_listen = f.clients_listen;
  o.policy = f.policy;
  o.tls_cert = f.tls_cert;
  o.tls_key = f.tls_key;
  o.tls_ca = f.tls_ca;
  o.insecure = f.insecure;
  o.max_queued = f.max_queued;
  o.paused = f.paused;
  o.metrics_listen = f.metrics_listen;
  o.scheduler = f.scheduler;
  o.advertise_host = f.advertise_host;
  o.max_running = f.max_running;
  if (!f.job_ports.empty() &&
      std::sscanf(f.job_ports.c_str(), "%d-%d", &o.job_port_lo, &o.job_port_hi) != 2) {
    std::cerr << "cleave-server: --job-ports " << f.job_ports << ": LO-HI\n";
    return 2;
  }
  auto daemon = cleave::Daemon::Start(std::move(o));
  if (!daemon.ok()) {
    std::cerr << "cleave-server: " << daemon.status().message() << "\n";
    return 2;
  }
  cleave::SignalWatcher signals([&](int sig) {
    spdlog::warn("signal {}: stopping (a running job resumes at the next start)", sig);
    (*daemon)->Stop();
  });
  (*daemon)->Wait();
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"cleave-server: the federated-learning coordinator"};
  Flags f;
  AddFlags(app, f);
  if (int rc = cleave::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (f.daemon) return RunDaemon(f);
  if (f.config_path.empty()) {
    std::cerr << "cleave-server: --config JOB.yaml runs one job; --daemon runs submitted ones\n";
    return 2;
  }

  auto config = LoadConfig(f);
  if (!config.ok()) {
    std::cerr << "cleave-server: " << config.status().message() << "\n";
    return 2;
  }
  RaiseDescriptorLimit();
  const std::string run_dir = f.run_dir.empty() ? "runs/" + config->run.name : f.run_dir;
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) {
    std::cerr << "cleave-server: cannot create " << run_dir << ": " << ec.message() << "\n";
    return 2;
  }
  if (auto s = cleave::SetupLogging("server", run_dir + "/server.log", f.log_level, "",
                                    f.log_format);
      !s.ok()) {
    std::cerr << "cleave-server: " << s.message() << "\n";
    return 2;
  }
  cleave::SetTorchThreads(f.torch_threads);

  cleave::ServerOptions opts;
  opts.config = *config;
  opts.listen = f.listen;
  opts.run_dir = run_dir;
  opts.insecure = f.insecure;
  opts.config_text = cleave::ReadFile(f.config_path).value_or("");
  auto server = cleave::Server::Create(std::move(opts));
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 1;
  }
  if (auto s = (*server)->Start(); !s.ok()) {
    spdlog::error("{}", s.ToString());
    return 1;
  }
  const cleave::Status status = RunServer(**server, f, *config);
  if (!status.ok()) {
    spdlog::error("run ended: {}", status.ToString());
    return status.code() == absl::StatusCode::kCancelled ? 130 : 1;
  }
  spdlog::info("run completed: {} rounds; run directory {}", (*server)->committed_round(), run_dir);
  return 0;
}
