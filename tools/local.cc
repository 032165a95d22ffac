#include "tools/local.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/config.h"
#include "core/files.h"
#include "core/device_trace.h"
#include "privacy/certs.h"
#include "tools/report.h"
#include "tools/round_lines.h"
#include "job/job.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;
volatile sig_atomic_t g_interrupted = 0;

struct Child {
  std::string name;
  pid_t pid = -1;
  int exit_code = -1;  // set once reaped
  std::vector<std::string> argv;  // to start it again (local.trace)
  bool offline = false;           // stopped by the device trace: not a failure
};

// Starts `argv` with stdout and stderr to `log`; the child dies with this process.
pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() == 1) _exit(127);
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
  }
  int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, 0);
  // Children handle signals by default; cleave local forwards them.
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  std::perror(("exec " + argv[0]).c_str());
  _exit(127);
}

void Reap(std::vector<Child>& children) {
  for (auto& c : children) {
    if (c.exit_code != -1) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
      c.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
  }
}

// SIGTERM to everything still running, then SIGKILL after `grace`.
void StopAll(std::vector<Child>& children, std::chrono::seconds grace) {
  for (auto& c : children) {
    if (c.exit_code == -1) kill(c.pid, SIGTERM);
  }
  const auto until = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < until) {
    Reap(children);
    bool all = true;
    for (auto& c : children) all = all && c.exit_code != -1;
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (auto& c : children) {
    if (c.exit_code == -1) {
      kill(c.pid, SIGKILL);
      int status = 0;
      waitpid(c.pid, &status, 0);
      c.exit_code = 137;
    }
  }
}

// The last `n` lines of a file, each ending in a newline.
std::string LastLines(const std::string& path, int n) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string out;
  for (size_t i = lines.size() > static_cast<size_t>(n) ? lines.size() - n : 0; i < lines.size();
       ++i) {
    out += "  " + lines[i] + "\n";
  }
  return out;
}


}  // namespace

int RunLocal(const LocalOptions& o) {
  auto config = LoadJob(o.config_path);
  if (!config.ok()) {
    std::cerr << "cleave local: " << config.status().message() << "\n";
    return 2;
  }
  const int clients = o.clients > 0 ? o.clients : config->local.clients;
  const int64_t rounds = o.rounds > 0 ? o.rounds : config->run.rounds;
  if (clients < config->clients.min_clients) {
    std::cerr << "cleave local: --clients " << clients << " is below clients.min="
              << config->clients.min_clients << " of " << o.config_path << "\n";
    return 2;
  }
  std::vector<DeviceTrace> traces;
  if (!config->local.trace.empty()) {
    auto t = ReadDeviceTraces(config->local.trace);
    if (!t.ok()) {
      std::cerr << "cleave local: " << t.status().message() << "\n";
      return 2;
    }
    traces = *std::move(t);
  }
  const std::string run_dir =
      o.run_dir.empty() ? absl::StrCat("runs/", config->run.name, "-", Timestamp()) : o.run_dir;
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) {
    std::cerr << "cleave local: cannot create " << run_dir << ": " << ec.message() << "\n";
    return 2;
  }
  const std::string server_bin = o.bin_dir + "/cleave-server";
  const std::string client_bin = o.bin_dir + "/cleave-client";
  for (const auto& b : {server_bin, client_bin}) {
    if (access(b.c_str(), X_OK) != 0) {
      std::cerr << "cleave local: " << b << " not found (build the project first)\n";
      return 2;
    }
  }

  // TLS identities for the run: the server's certificate and, with tls.mutual, one per
  // client (CN = its name).
  const std::string certs = run_dir + "/certs";
  if (o.insecure && config->tls.mutual) {
    std::cerr << "cleave local: " << o.config_path << " sets tls.mutual; drop --insecure\n";
    return 2;
  }
  if (!o.insecure) {
    if (!config->tls.cert.empty()) {
      std::cout << "cleave local: using certificates made for the run in " << certs
                << " instead of tls.cert/tls.key/tls.ca\n";
    }
    Status s = fs::exists(certs + "/ca.crt") ? absl::OkStatus() : InitFederation(certs);
    for (int i = 0; s.ok() && config->tls.mutual && i < clients; ++i) {
      const std::string name = absl::StrCat("client-", i);
      if (!fs::exists(certs + "/clients/" + name + ".crt")) s = IssueClientCert(certs, name);
    }
    if (!s.ok()) {
      std::cerr << "cleave local: provisioning certificates in " << certs << ": " << s.message()
                << "\n";
      return 1;
    }
  }

  struct sigaction sa {};
  sa.sa_handler = [](int) { g_interrupted = 1; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const std::string addr_file = run_dir + "/server.addr";
  fs::remove(addr_file, ec);
  std::vector<Child> procs;
  std::vector<std::string> server_argv = {server_bin, "--config", o.config_path, "--run-dir",
                                          run_dir, "--listen", "127.0.0.1:0"};
  if (o.rounds > 0) {
    server_argv.push_back("--rounds");
    server_argv.push_back(std::to_string(o.rounds));
  }
  if (o.insecure) {
    server_argv.push_back("--insecure");
  } else {
    for (const char* f : {"--tls-cert", "server.crt", "--tls-key", "server.key", "--tls-ca", "ca.crt"}) {
      server_argv.push_back(f[0] == '-' ? f : certs + "/" + f);
    }
  }
  Child server;
  server.name = "server";
  server.pid = Spawn(server_argv, run_dir + "/server.stderr.log");
  procs.push_back(std::move(server));
  std::cout << "cleave local: " << config->run.name << ", " << clients << " clients, " << rounds
            << " rounds, model " << config->model.name << ", strategy " << config->strategy.name
            << ", partition " << config->local.partition
            << (config->split.enabled() ? ", split " + config->split.mode : std::string())
            << (o.insecure ? ", plaintext" : config->tls.mutual ? ", mutual TLS" : ", TLS")
            << (config->local.attackers > 0
                    ? absl::StrCat(", ", config->local.attackers, " attackers (",
                                   config->local.attack, ")")
                    : std::string())
            << (config->aggregation.rule != "mean" ? ", aggregation " + config->aggregation.rule
                                                   : std::string())
            << (config->dp.enabled ? ", DP" : "")
            << "\n"
            << "run directory: " << run_dir << "\n"
            << std::flush;

  // Wait for the server to bind.
  std::string addr;
  const auto bind_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (addr.empty()) {
    Reap(procs);
    if (procs[0].exit_code != -1) {
      std::cerr << "cleave local: the server exited with code " << procs[0].exit_code
                << " before listening; see " << run_dir << "/server.stderr.log\n";
      return 1;
    }
    if (g_interrupted || std::chrono::steady_clock::now() > bind_deadline) {
      StopAll(procs, std::chrono::seconds(5));
      std::cerr << "cleave local: " << (g_interrupted ? "interrupted" : "server did not start")
                << "\n";
      return g_interrupted ? 130 : 1;
    }
    auto text = ReadFile(addr_file);
    if (text.ok() && !text->empty() && text->back() == '\n') {
      addr = text->substr(0, text->size() - 1);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  auto trace_of = [&](size_t client) -> const DeviceTrace* {
    return traces.empty() ? nullptr : &traces[client % traces.size()];
  };
  for (int i = 0; i < clients; ++i) {
    const std::string name = absl::StrCat("client-", i);
    std::vector<std::string> argv = {
        client_bin, "--server", addr, "--data", config->local.data, "--partition",
        absl::StrCat(config->local.partition, ",client=", i, ",of=", clients, ",seed=",
                     config->local.partition_seed),
        "--name", name, "--give-up-after", "60"};
    if (config->local.holdout > 0) {
      argv.insert(argv.end(), {"--holdout", absl::StrCat(config->local.holdout)});
    }
    if (config->scheduler.gossip()) {  // it serves its neighbours on a port of its own
      argv.insert(argv.end(), {"--peer-listen", "127.0.0.1:0"});
    }
    if (!config->model.personal.empty()) {  // kept across a resumed run's client restarts
      argv.insert(argv.end(), {"--state-dir", run_dir + "/clients/" + name});
    }
    if (i >= clients - config->local.attackers) {
      argv.insert(argv.end(), {"--attack", config->local.attack});
    }
    if (o.insecure) {
      argv.push_back("--insecure");
    } else {
      argv.insert(argv.end(), {"--ca", certs + "/ca.crt"});
      if (config->tls.mutual) {
        argv.insert(argv.end(), {"--cert", certs + "/clients/" + name + ".crt", "--key",
                                 certs + "/clients/" + name + ".key"});
      }
      if (!config->auth.token_file.empty()) {
        argv.insert(argv.end(), {"--token-file", config->auth.token_file});
      }
    }
    if (trace_of(i) || !config->local.profiles.empty()) {  // device emulation
      const DeviceEmulation& d = trace_of(i)
                                     ? trace_of(i)->device
                                     : config->local.profiles[i % config->local.profiles.size()];
      for (const auto& [flag, value] :
           std::vector<std::pair<std::string, std::string>>{
               {"--emulate-uplink-mbps", absl::StrCat(d.uplink_mbps)},
               {"--emulate-downlink-mbps", absl::StrCat(d.downlink_mbps)},
               {"--emulate-slowdown", absl::StrCat(d.slowdown)},
               {"--memory-limit-mb", absl::StrCat(d.memory_limit_mb)}}) {
        argv.push_back(flag);
        argv.push_back(value);
      }
    }
    Child c;
    c.name = name;
    c.argv = argv;
    if (!trace_of(i) || trace_of(i)->OnlineAt(0)) {
      c.pid = Spawn(argv, run_dir + "/" + name + ".log");
    } else {
      c.offline = true;
      c.exit_code = 0;
    }
    procs.push_back(std::move(c));
  }

  // Follow metrics.jsonl until the server exits.
  const auto start = std::chrono::steady_clock::now();
  RoundPrinter printer(run_dir, rounds);
  // Clients that failed on their own (bad data path, crash): once too few are left for
  // clients.min, the server would only wait out its join timeout, so stop now.
  auto failed_clients = [&] {
    std::vector<const Child*> failed;
    for (size_t i = 1; i < procs.size(); ++i) {
      if (procs[i].exit_code > 0 && !procs[i].offline) failed.push_back(&procs[i]);
    }
    return failed;
  };
  while (procs[0].exit_code == -1 && !g_interrupted) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Reap(procs);
    printer.Drain();
    // Follow the device trace: a client whose window closed is stopped (a dropout), one
    // whose window opened is started again.
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (size_t i = 1; !traces.empty() && i < procs.size(); ++i) {
      Child& c = procs[i];
      const bool online = trace_of(i - 1)->OnlineAt(t);
      if (online && c.offline && c.exit_code != -1) {
        c.pid = Spawn(c.argv, run_dir + "/" + c.name + ".log");
        c.exit_code = -1;
        c.offline = false;
      } else if (!online && !c.offline && c.exit_code == -1) {
        kill(c.pid, SIGTERM);
        c.offline = true;
      }
    }
    const auto failed = failed_clients();
    if (clients - static_cast<int>(failed.size()) < config->clients.min_clients) {
      std::cout << "cleave local: " << failed.size() << " of " << clients
                << " clients failed, fewer than clients.min=" << config->clients.min_clients
                << " remain; stopping. First failure (" << failed[0]->name << "):\n"
                << LastLines(run_dir + "/" + failed[0]->name + ".log", 3);
      StopAll(procs, std::chrono::seconds(5));
      return 1;
    }
  }
  printer.Drain();
  if (g_interrupted) {
    std::cout << "cleave local: interrupted; stopping every process\n";
    StopAll(procs, std::chrono::seconds(5));
    std::cout << "the last committed round is checkpointed in " << run_dir << "\n";
    return 130;
  }
  // After a completed run the server told clients it ended: give them a moment to exit
  // on their own. After a failed one they would only retry, so stop them now.
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(procs[0].exit_code == 0 ? 10 : 0);
  while (std::chrono::steady_clock::now() < until) {
    Reap(procs);
    bool all = true;
    for (auto& c : procs) all = all && c.exit_code != -1;
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  StopAll(procs, std::chrono::seconds(2));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int code = procs[0].exit_code;
  const size_t failed = failed_clients().size();
  if (code != 0) {
    std::cout << "cleave local: the server exited with code " << code << "; see " << run_dir
              << "/server.log\n";
    return 1;
  }
  std::cout << absl::StrFormat("done: %d rounds in %.0fs; final %s; %s up, %s down\n",
                               printer.last().value("round", 0), secs,
                               AccuracyText(printer.last()), Bytes(printer.total_up()),
                               Bytes(printer.total_down()));
  if (failed > 0) {
    std::cout << failed << " client(s) exited with an error; see " << run_dir
              << "/client-*.log\n";
  }
  std::cout << "run directory: " << run_dir << " (metrics.jsonl, server.log, checkpoint.pb)\n";
  PrintReport(run_dir);
  return 0;
}

}  // namespace cleave
