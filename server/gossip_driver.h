// GossipDriver: decentralised rounds (scheduler.mode: gossip, after DySTop's
// decentralised mode). Each round the server draws a graph over the round's clients
// (server/topology.h: a ring, or random rings anew each round) and names each client's
// neighbours in its task, with their Peer addresses, Metropolis-Hastings weights and a
// fresh secret per edge. Clients train the model they hold, send it to their
// neighbours peer to peer, average what they receive and keep the result; they upload
// an empty parameter set whose header reports the exchange. The server coordinates
// membership and topology only: it never receives a trained model (clients fetch the
// initial model from it once), so there is nothing to aggregate and its model stays
// the initial one.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cleave/v1/cleave.pb.h"
#include "server/coordinator.h"
#include "server/round_driver.h"

namespace cleave {

class GossipDriver : public RoundDriver {
 public:
  explicit GossipDriver(Coordinator& c) : c_(c) {}

  // Leaves out clients that serve no Peer address, draws the round's graph over the
  // others (in name order) and their edges' secrets.
  Status BeginLocked(int64_t round, const FitSettings& fit, std::vector<std::string>* clients)
      override ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_.mu_);
  void PrepareTaskLocked(v1::Task* task, TaskRecord* rec) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_.mu_);
  // A gossip task's report (an empty parameter set): nothing to add.
  bool TakeLocked(const v1::UploadHeader& h, const std::string& payload, const TaskRecord& t,
                  Status* status) override;
  void CloseLocked(int64_t round, RoundMetrics* m) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_.mu_);
  bool Aggregates() const override { return false; }
  bool ClientsEvaluate() const override { return false; }

 private:
  Coordinator& c_;
  // The open round's gossip part of each client's task (by session id).
  std::map<std::string, v1::GossipTask> tasks_ ABSL_GUARDED_BY(c_.mu_);
};

}  // namespace cleave
