// Hierarchical aggregation: a cleave-server that runs rounds for its own clients and
// joins an upstream coordinator as one client (cleave-server --upstream HOST:PORT).
// For each upstream task it runs one synchronous round of its clients from the task's
// model, with the task's training settings and batch seed, and uploads their weighted
// mean update with the sum of their weights as its example count. The upstream's
// FedAvg over edges is then exactly the flat FedAvg over all their clients (to float
// summation order). Any depth: an edge's clients may be edges themselves.
#pragma once

#include <memory>

#include "client/client.h"
#include "core/mutex.h"
#include "core/status.h"
#include "server/options.h"
#include "server/server.h"

namespace cleave::v1 {
class TrainConfig;  // cleave.pb.h, kept out of this header
}  // namespace cleave::v1

namespace cleave {

// OK when `config` hands up a plain weighted mean: strategy fedavg with server_lr 1,
// aggregation.rule mean, no dp, no split.mode, synchronous rounds; otherwise
// INVALID_ARGUMENT naming what does not fit.
Status CheckEdgeConfig(const FederationConfig& config);

class Edge {
 public:
  // `server` is started; `upstream` names the upstream coordinator (server or channel,
  // TLS, name). Its aggregate and declared_examples are set by Run.
  Edge(Server* server, ClientOptions upstream);
  // Waits for clients.min clients, joins upstream declaring their examples, and works
  // for it until its run ends (OK; this server's clients are then told it ended), Stop
  // (CANCELLED), or an error (the upstream client's status).
  Status Run();
  void Stop();

 private:
  Server* server_;
  ClientOptions upstream_;
  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<Client> client_ ABSL_GUARDED_BY(mu_);  // set by Run
};

}  // namespace cleave
