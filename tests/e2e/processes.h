// Test helpers for end-to-end tests: the project's binaries as child processes.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/files.h"
#include "tests/deadline.h"

namespace cleave::testing {

// Starts `argv` (an absolute path first) with stdout and stderr to `out_path`, and with
// at most `max_fds` descriptors when that is not 0.
inline pid_t SpawnProcess(std::vector<std::string> argv, const std::string& out_path,
                          rlim_t max_fds = 0) {
  pid_t pid = fork();
  if (pid == 0) {
    if (max_fds > 0) {
      const rlimit r{max_fds, max_fds};
      setrlimit(RLIMIT_NOFILE, &r);
    }
    if (!freopen(out_path.c_str(), "w", stdout)) _exit(126);
    dup2(1, 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Starts build/bin/`argv[0]` as SpawnProcess does.
inline pid_t SpawnBinary(std::vector<std::string> argv, const std::string& out_path,
                         rlim_t max_fds = 0) {
  argv[0] = std::string(CLEAVE_BIN_DIR) + "/" + argv[0];
  return SpawnProcess(std::move(argv), out_path, max_fds);
}

// The exit code of `pid` (128 + signal when killed), or -1 after killing it when it
// has not ended within `timeout_s`.
inline int WaitForExit(pid_t pid, int timeout_s) {
  for (int i = 0; i < ScaledSeconds(timeout_s) * 10; ++i) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

// A port free on 127.0.0.1 now (the kernel's pick for a socket bound to port 0, closed
// again), for a process that must be told its port before it starts.
inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

// "127.0.0.1:PORT" from a server's run directory (its server.addr; a daemon's state
// directory: daemon.addr), once it listens;
// empty after 30 s.
inline std::string WaitForAddress(const std::filesystem::path& run, const std::string& file = "server.addr") {
  for (int i = 0; i < 300; ++i) {
    auto addr = ReadFile((run / file).string());
    if (addr.ok() && !addr->empty()) return addr->substr(0, addr->find('\n'));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return "";
}

// Whether the file at `path` (a process's output) holds `text` within `timeout_s`
// (scaled for slow machines).
inline bool WaitForText(const std::filesystem::path& path, const std::string& text, int timeout_s = 60) {
  for (int i = 0; i < ScaledSeconds(timeout_s) * 10; ++i) {
    if (ReadFile(path.string()).value_or("").find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The rows of a run directory's metrics.jsonl, in order.
inline std::vector<nlohmann::json> MetricsRows(const std::filesystem::path& run) {
  std::ifstream metrics(run / "metrics.jsonl");
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(metrics, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

}  // namespace cleave::testing
