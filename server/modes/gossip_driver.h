// GossipDriver: decentralised rounds (scheduler.mode: gossip, after DySTop's
// decentralised mode). Each round the server draws a graph over the round's clients
// (server/modes/topology.h: a ring, or random rings anew each round) and names each client's
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
#include "server/rounds/round_context.h"
#include "server/rounds/round_driver.h"

namespace cleave {

class GossipDriver : public RoundDriver {
 public:
  // It needs the round's sessions and tasks (under their mutex) and the run's config.
  GossipDriver(RoundTasks& round, const RunFacts& run) : ctx_(round), run_(run) {}

  // Leaves out clients that serve no Peer address, draws the round's graph over the
  // others (in name order) and their edges' secrets.
  Status ChooseLocked(int64_t round, const FitSettings& fit, std::vector<std::string>* clients)
      override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void PrepareTaskLocked(v1::Task* task, TaskRecord* rec) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The exchange a task reports: counts and bytes >= 0, heard <= neighbours <= 1024,
  // disagreement and uplink finite and >= 0.
  Status CheckUploadLocked(const TaskRecord& t, const v1::UploadHeader& h) override;
  // A gossip task's report (an empty parameter set): nothing to add.
  bool TakeLocked(const v1::UploadHeader& h, const std::string& payload, const TaskRecord& t,
                  Status* status) override;
  void AcceptedLocked(const TaskRecord& t, const v1::UploadHeader& h) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    reports_[t.id] = h.gossip();
  }
  void SessionEndedLocked(const std::string& client_id) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    uplinks_.erase(client_id);
  }
  void CloseLocked(int64_t round, RoundMetrics* m) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  bool Aggregates() const override { return false; }
  bool ClientsEvaluate() const override { return false; }

 private:
  RoundTasks& ctx_;
  const RunFacts& run_;
  // The open round's gossip part of each client's task (by session id), and the
  // exchanges its accepted tasks reported (by task id).
  std::map<std::string, v1::GossipTask> tasks_ ABSL_GUARDED_BY(ctx_.mu());
  std::map<std::string, v1::GossipStats> reports_ ABSL_GUARDED_BY(ctx_.mu());
  // Each session's measured uplink (GossipStats.uplink_mbps), an average over rounds with
  // weight 1/2 on the newest; absent until measured. topology: measured reads it.
  std::map<std::string, double> uplinks_ ABSL_GUARDED_BY(ctx_.mu());
};

}  // namespace cleave
