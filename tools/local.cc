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
#include "core/device_trace.h"
#include "core/files.h"
#include "job/job.h"
#include "models/kinds.h"
#include "privacy/certs.h"
#include "tools/report.h"
#include "tools/round_lines.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;
volatile sig_atomic_t g_local_interrupted = 0;

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

// What a local run works with once its job is loaded and checked.
struct LocalRun {
  explicit LocalRun(const LocalOptions& options) : o(options) {}
  const LocalOptions& o;
  JobConfig config;
  int clients = 0;
  int64_t rounds = 0;
  std::vector<DeviceTrace> traces;  // local.trace; empty: none
  std::string run_dir, certs, server_bin, client_bin;
  std::vector<Child> procs;  // the server first, then client i at i + 1

  const DeviceTrace* TraceOf(size_t client) const {
    return traces.empty() ? nullptr : &traces[client % traces.size()];
  }
  // Clients that failed on their own (bad data path, crash), not stopped by the trace.
  std::vector<const Child*> FailedClients() const {
    std::vector<const Child*> failed;
    for (size_t i = 1; i < procs.size(); ++i) {
      if (procs[i].exit_code > 0 && !procs[i].offline) failed.push_back(&procs[i]);
    }
    return failed;
  }
};

// Everything checked before a process starts: the job, the client count, the trace, the
// run directory and the binaries. 0, or the exit code after saying why.
int Prepare(LocalRun& r) {
  const LocalOptions& o = r.o;
  auto config = LoadJob(o.config_path);
  if (!config.ok()) {
    std::cerr << "cleave local: " << config.status().message() << "\n";
    return 2;
  }
  r.config = *std::move(config);
  r.clients = o.clients > 0 ? o.clients : r.config.local.clients;
  r.rounds = o.rounds > 0 ? o.rounds : r.config.run.rounds;
  if (r.clients < r.config.clients.min_clients) {
    std::cerr << "cleave local: --clients " << r.clients << " is below clients.min="
              << r.config.clients.min_clients << " of " << o.config_path << "\n";
    return 2;
  }
  if (!r.config.local.trace.empty()) {
    auto t = ReadDeviceTraces(r.config.local.trace);
    if (!t.ok()) {
      std::cerr << "cleave local: " << t.status().message() << "\n";
      return 2;
    }
    r.traces = *std::move(t);
  }
  r.run_dir =
      o.run_dir.empty() ? absl::StrCat("runs/", r.config.run.name, "-", Timestamp()) : o.run_dir;
  std::error_code ec;
  fs::create_directories(r.run_dir, ec);
  if (ec) {
    std::cerr << "cleave local: cannot create " << r.run_dir << ": " << ec.message() << "\n";
    return 2;
  }
  r.server_bin = o.bin_dir + "/cleave-server";
  r.client_bin = o.bin_dir + "/cleave-client";
  for (const auto& b : {r.server_bin, r.client_bin}) {
    if (access(b.c_str(), X_OK) != 0) {
      std::cerr << "cleave local: " << b << " not found (build the project first)\n";
      return 2;
    }
  }
  r.certs = r.run_dir + "/certs";
  if (o.insecure && r.config.tls.mutual) {
    std::cerr << "cleave local: " << o.config_path << " sets tls.mutual; drop --insecure\n";
    return 2;
  }
  if (!o.insecure && !r.config.tls.mutual && r.config.ClientsServePeer()) {
    std::cerr << "cleave local: " << o.config_path << ": clients that serve each other (scheduler.mode: gossip, "
              << "split.mode: pipeline) verify each other's certificates over TLS: set tls.mutual: true (or run "
              << "with --insecure)\n";
    return 2;
  }
  return 0;
}

// TLS identities for the run: the server's certificate and, with tls.mutual, one per
// client (CN = its name). 0, or the exit code after saying why.
int ProvisionCertificates(const LocalRun& r) {
  if (r.o.insecure) return 0;
  if (!r.config.tls.cert.empty()) {
    std::cout << "cleave local: using certificates made for the run in " << r.certs
              << " instead of tls.cert/tls.key/tls.ca\n";
  }
  Status s = fs::exists(r.certs + "/ca.crt") ? absl::OkStatus() : InitFederation(r.certs);
  for (int i = 0; s.ok() && r.config.tls.mutual && i < r.clients; ++i) {
    const std::string name = absl::StrCat("client-", i);
    if (!fs::exists(r.certs + "/clients/" + name + ".crt")) s = IssueClientCert(r.certs, name);
  }
  if (!s.ok()) {
    std::cerr << "cleave local: provisioning certificates in " << r.certs << ": " << s.message()
              << "\n";
    return 1;
  }
  return 0;
}

std::vector<std::string> ServerArgv(const LocalRun& r) {
  std::vector<std::string> argv = {r.server_bin, "--config", r.o.config_path, "--run-dir",
                                   r.run_dir,    "--listen", "127.0.0.1:0"};
  if (r.o.rounds > 0) {
    argv.push_back("--rounds");
    argv.push_back(std::to_string(r.o.rounds));
  }
  if (r.o.insecure) {
    argv.push_back("--insecure");
  } else {
    for (const char* f : {"--tls-cert", "server.crt", "--tls-key", "server.key", "--tls-ca", "ca.crt"}) {
      argv.push_back(f[0] == '-' ? f : r.certs + "/" + f);
    }
  }
  return argv;
}

void PrintBanner(const LocalRun& r) {
  const JobConfig& c = r.config;
  std::cout << "cleave local: " << c.run.name << ", " << r.clients << " clients, " << r.rounds
            << " rounds, model " << c.model.name << ", strategy " << c.strategy.name
            << ", partition " << c.local.partition
            << (c.split.enabled() ? ", split " + c.split.mode : std::string())
            << (r.o.insecure ? ", plaintext" : c.tls.mutual ? ", mutual TLS" : ", TLS")
            << (c.local.attackers > 0
                    ? absl::StrCat(", ", c.local.attackers, " attackers (", c.local.attack, ")")
                    : std::string())
            << (c.aggregation.rule != "mean" ? ", aggregation " + c.aggregation.rule
                                             : std::string())
            << (c.dp.enabled ? ", DP" : "") << "\n"
            << "run directory: " << r.run_dir << "\n"
            << std::flush;
}

// Waits for the server (procs[0]) to write its address. 0 with *addr, or the exit code
// after saying why.
int AwaitServerAddress(LocalRun& r, std::string* addr) {
  const std::string addr_file = r.run_dir + "/server.addr";
  const auto bind_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (addr->empty()) {
    Reap(r.procs);
    if (r.procs[0].exit_code != -1) {
      std::cerr << "cleave local: the server exited with code " << r.procs[0].exit_code
                << " before listening; see " << r.run_dir << "/server.stderr.log\n";
      return 1;
    }
    if (g_local_interrupted || std::chrono::steady_clock::now() > bind_deadline) {
      StopAll(r.procs, std::chrono::seconds(5));
      std::cerr << "cleave local: " << (g_local_interrupted ? "interrupted" : "server did not start")
                << "\n";
      return g_local_interrupted ? 130 : 1;
    }
    auto text = ReadFile(addr_file);
    if (text.ok() && !text->empty() && text->back() == '\n') {
      *addr = text->substr(0, text->size() - 1);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return 0;
}

// Client i's command line: its data part, name, role and identity, and its emulated
// device (a trace's or a profile's).
std::vector<std::string> ClientArgv(const LocalRun& r, int i, const std::string& addr) {
  const JobConfig& c = r.config;
  const std::string name = absl::StrCat("client-", i);
  std::vector<std::string> argv = {
      r.client_bin, "--server", addr, "--data", c.local.data, "--partition",
      absl::StrCat(c.local.partition, ",client=", i, ",of=", r.clients, ",seed=",
                   c.local.partition_seed),
      "--name", name, "--give-up-after", "60"};
  if (c.local.holdout > 0) argv.insert(argv.end(), {"--holdout", absl::StrCat(c.local.holdout)});
  // Gossip neighbours and a pipeline's devices reach it on a port of its own.
  if (c.ClientsServePeer()) {
    argv.insert(argv.end(), {"--peer-listen", "127.0.0.1:0"});
  }
  // Personal layers and interop's private bases: kept across a resumed run's client restarts.
  // split.record, server.record_updates: each device keeps its own copy of what it
  // sent (its first batch, for an update), the truth the recorded attacks are scored
  // against (cleave attack).
  const int keep = c.split.record > 0 ? c.split.record : c.server.record_updates > 0 ? 1 : 0;
  if (!c.model.personal.empty() || ModelTraitsOf(c.model.name).has_private_tensors() || keep > 0) {
    argv.insert(argv.end(), {"--state-dir", r.run_dir + "/clients/" + name});
  }
  if (keep > 0) argv.insert(argv.end(), {"--keep-sent", absl::StrCat(keep)});
  if (i >= r.clients - c.local.attackers) argv.insert(argv.end(), {"--attack", c.local.attack});
  if (c.local.split_guard) argv.push_back("--split-guard");
  if (r.o.insecure) {
    argv.push_back("--insecure");
  } else {
    argv.insert(argv.end(), {"--ca", r.certs + "/ca.crt"});
    if (c.tls.mutual) {
      argv.insert(argv.end(), {"--cert", r.certs + "/clients/" + name + ".crt", "--key",
                               r.certs + "/clients/" + name + ".key"});
    }
    if (!c.auth.token_file.empty()) argv.insert(argv.end(), {"--token-file", c.auth.token_file});
  }
  if (r.TraceOf(i) || !c.local.profiles.empty()) {  // device emulation
    const DeviceEmulation& d =
        r.TraceOf(i) ? r.TraceOf(i)->device : c.local.profiles[i % c.local.profiles.size()];
    for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
             {"--emulate-uplink-mbps", absl::StrCat(d.uplink_mbps)},
             {"--emulate-downlink-mbps", absl::StrCat(d.downlink_mbps)},
             {"--emulate-slowdown", absl::StrCat(d.slowdown)},
             {"--memory-limit-mb", absl::StrCat(d.memory_limit_mb)}}) {
      argv.push_back(flag);
      argv.push_back(value);
    }
  }
  return argv;
}

// Starts every client that its trace has online at the start (the others wait offline).
void StartClients(LocalRun& r, const std::string& addr) {
  for (int i = 0; i < r.clients; ++i) {
    Child c;
    c.name = absl::StrCat("client-", i);
    c.argv = ClientArgv(r, i, addr);
    if (!r.TraceOf(i) || r.TraceOf(i)->OnlineAt(0)) {
      c.pid = Spawn(c.argv, r.run_dir + "/" + c.name + ".log");
    } else {
      c.offline = true;
      c.exit_code = 0;
    }
    r.procs.push_back(std::move(c));
  }
}

// Follows metrics.jsonl until the server exits or the run is interrupted, stopping and
// starting clients as the device trace says. -1 while the run may end normally, or the
// exit code once too few clients are left for clients.min.
int Supervise(LocalRun& r, RoundPrinter& printer, std::chrono::steady_clock::time_point start) {
  while (r.procs[0].exit_code == -1 && !g_local_interrupted) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Reap(r.procs);
    printer.Drain();
    // Follow the device trace: a client whose window closed is stopped (a dropout), one
    // whose window opened is started again.
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (size_t i = 1; !r.traces.empty() && i < r.procs.size(); ++i) {
      Child& c = r.procs[i];
      const bool online = r.TraceOf(i - 1)->OnlineAt(t);
      if (online && c.offline && c.exit_code != -1) {
        c.pid = Spawn(c.argv, r.run_dir + "/" + c.name + ".log");
        c.exit_code = -1;
        c.offline = false;
      } else if (!online && !c.offline && c.exit_code == -1) {
        kill(c.pid, SIGTERM);
        c.offline = true;
      }
    }
    // Once too few clients are left for clients.min, the server would only wait out its
    // join timeout: stop now.
    const auto failed = r.FailedClients();
    if (r.clients - static_cast<int>(failed.size()) < r.config.clients.min_clients) {
      std::cout << "cleave local: " << failed.size() << " of " << r.clients
                << " clients failed, fewer than clients.min=" << r.config.clients.min_clients
                << " remain; stopping. First failure (" << failed[0]->name << "):\n"
                << LastLines(r.run_dir + "/" + failed[0]->name + ".log", 3);
      StopAll(r.procs, std::chrono::seconds(5));
      return 1;
    }
  }
  return -1;
}

// After the server exited: the clients' exit, then the run's summary and report.
int Finish(LocalRun& r, RoundPrinter& printer, std::chrono::steady_clock::time_point start) {
  // After a completed run the server told clients it ended: give them a moment to exit
  // on their own. After a failed one they would only retry, so stop them now.
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::seconds(r.procs[0].exit_code == 0 ? 10 : 0);
  while (std::chrono::steady_clock::now() < until) {
    Reap(r.procs);
    bool all = true;
    for (auto& c : r.procs) all = all && c.exit_code != -1;
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  StopAll(r.procs, std::chrono::seconds(2));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (r.procs[0].exit_code != 0) {
    std::cout << "cleave local: the server exited with code " << r.procs[0].exit_code << "; see "
              << r.run_dir << "/server.log\n";
    return 1;
  }
  std::cout << absl::StrFormat("done: %d rounds in %.0fs; final %s; %s up, %s down\n",
                               printer.last().value("round", 0), secs,
                               AccuracyText(printer.last()), Bytes(printer.total_up()),
                               Bytes(printer.total_down()));
  if (const size_t failed = r.FailedClients().size(); failed > 0) {
    std::cout << failed << " client(s) exited with an error; see " << r.run_dir
              << "/client-*.log\n";
  }
  std::cout << "run directory: " << r.run_dir << " (metrics.jsonl, server.log, checkpoint.pb)\n";
  PrintReport(r.run_dir);
  return 0;
}

}  // namespace

int RunLocal(const LocalOptions& o) {
  LocalRun r(o);
  if (int code = Prepare(r); code != 0) return code;
  if (int code = ProvisionCertificates(r); code != 0) return code;
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_local_interrupted = 1; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::error_code ec;
  fs::remove(r.run_dir + "/server.addr", ec);
  Child server;
  server.name = "server";
  server.pid = Spawn(ServerArgv(r), r.run_dir + "/server.stderr.log");
  r.procs.push_back(std::move(server));
  PrintBanner(r);
  std::string addr;
  if (int code = AwaitServerAddress(r, &addr); code != 0) return code;
  StartClients(r, addr);

  const auto start = std::chrono::steady_clock::now();
  RoundPrinter printer(r.run_dir, r.rounds);
  if (int code = Supervise(r, printer, start); code >= 0) return code;
  printer.Drain();
  if (g_local_interrupted) {
    std::cout << "cleave local: interrupted; stopping every process\n";
    StopAll(r.procs, std::chrono::seconds(5));
    std::cout << "the last committed round is checkpointed in " << r.run_dir << "\n";
    return 130;
  }
  return Finish(r, printer, start);
}

}  // namespace cleave
