// `cleave simulate`: a federation of thousands of virtual clients in this one process.
// The server runs here without a port, and every virtual client is a real Client (the
// code path of cleave-client) on an in-process gRPC channel; clients share the LibTorch
// runtime, the data set they were partitioned from, and task slots, so that only the
// few clients working on a task at a time hold training state.
#pragma once

#include <cstdint>
#include <string>

namespace cleave {

struct SimulateOptions {
  std::string config_path;
  int clients = 0;        // 0 = local.clients from the config
  int64_t rounds = 0;     // 0 = run.rounds
  std::string run_dir;    // empty = runs/<run.name>-sim-<timestamp>
  // Clients working on a task (fetch, train, upload) at once; 0 = the machine's cores.
  int task_slots = 0;
  std::string log_level = "info";  // simulate.log's level; stderr shows warnings and errors
};

// Runs the federation, prints one line per round and a summary (with the process's peak
// memory). Returns the exit code: 0 when the run completed.
int RunSimulate(const SimulateOptions& options);

}  // namespace cleave
