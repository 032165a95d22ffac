// cleave-server: the coordinator daemon.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>
#include <thread>

#include "core/files.h"
#include "core/logging.h"
#include "core/signals.h"
#include "models/model.h"
#include "server/server.h"

int main(int argc, char** argv) {
  CLI::App app{"cleave-server: the federated-learning coordinator"};
  std::string config_path, listen, run_dir, log_level = "info";
  int64_t rounds = 0;
  int torch_threads = 1;
  app.add_option("--config", config_path, "job config (YAML)")->required();
  app.add_option("--listen", listen, "address to listen on (default: server.listen)");
  app.add_option("--run-dir", run_dir, "run directory (default: runs/<run.name>)");
  app.add_option("--rounds", rounds, "override run.rounds");
  app.add_option("--torch-threads", torch_threads, "LibTorch threads for evaluation");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  CLI11_PARSE(app, argc, argv);

  auto config = cleave::JobConfig::Load(config_path);
  if (!config.ok()) {
    std::cerr << "cleave-server: " << config.status().message() << "\n";
    return 2;
  }
  if (rounds > 0) config->run.rounds = rounds;
  if (run_dir.empty()) run_dir = "runs/" + config->run.name;
  std::error_code ec;
  std::filesystem::create_directories(run_dir, ec);
  if (ec) {
    std::cerr << "cleave-server: cannot create " << run_dir << ": " << ec.message() << "\n";
    return 2;
  }
  cleave::SetupLogging("server", run_dir + "/server.log", log_level);
  cleave::SetTorchThreads(torch_threads);

  cleave::ServerOptions opts;
  opts.config = *config;
  opts.listen = listen;
  opts.run_dir = run_dir;
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
  {
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
