// Starting helper processes from a benchmark that already runs gRPC.
#pragma once

#include <unistd.h>

#include <string>
#include <vector>

namespace cleave {

// Forks and executes `argv` (argv[0] a path) at once, so nothing of this process's gRPC
// runs in the child. Returns the child's pid.
inline pid_t SpawnExec(std::vector<std::string> argv) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

}  // namespace cleave
