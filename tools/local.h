// `cleave local`: a whole federation as real processes on this machine.
#pragma once

#include <string>

namespace cleave {

struct LocalOptions {
  std::string config_path;
  int clients = 0;        // 0 = local.clients from the config
  std::string run_dir;    // empty = runs/<run.name>-<timestamp>
  int64_t rounds = 0;     // 0 = run.rounds from the config
  std::string bin_dir;    // where cleave-server and cleave-client are
  // Plaintext on loopback. Otherwise the federation speaks TLS with a CA and certificates
  // made for the run in RUN_DIR/certs (reused when the run is resumed); with tls.mutual
  // every client gets its own certificate.
  bool insecure = false;
};

// Starts the server and the clients, prints one line per round, and stops every process
// it started when the run ends, on error, or on SIGINT/SIGTERM. Returns the exit code.
int RunLocal(const LocalOptions& options);

}  // namespace cleave
