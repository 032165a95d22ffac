// RunLog: what the run has recorded, one of the coordinator's components: its id and the
// wall time it ran before a resume (both checkpointed), every round's
// metrics (the history the operator sees; metrics.jsonl holds the same lines with a run
// directory), the last test accuracy, whether clients report evaluations and which
// round's model had its final evaluation. A resumed run learns the last two from its
// metrics.jsonl (Resume). Not thread-safe: the coordinator's mutex guards it; the file
// writes are the coordinator's (RunFiles), off the lock.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "server/server.h"

namespace cleave {

class RunLog {
 public:
  // The run's id (a fresh one, or a resumed run's), and the wall time it ran before.
  void Begin(std::string run_id, double prior_elapsed_s) {
    run_id_ = std::move(run_id);
    prior_elapsed_s_ = prior_elapsed_s;
  }
  const std::string& run_id() const { return run_id_; }
  double prior_elapsed_s() const { return prior_elapsed_s_; }

  // A resumed run: drops the lines of `metrics_path` (metrics.jsonl) of rounds after
  // `committed_round` (the checkpoint's), and learns from the others whether clients
  // evaluate and which round had its final evaluation. OK without the file.
  Status Resume(const std::string& metrics_path, int64_t committed_round);

  // A committed round's metrics, or a final evaluation's (RoundMetrics::evaluation_only).
  void Add(const RoundMetrics& m);
  // An upload carried a client's evaluation: the run's end can ask clients for one.
  void ClientsEvaluate() { clients_evaluate_ = true; }
  void set_last_accuracy(double a) { last_accuracy_ = a; }

  const std::vector<RoundMetrics>& history() const { return history_; }
  bool clients_evaluate() const { return clients_evaluate_; }
  // The round whose model had its final evaluation (0: none).
  int64_t final_evaluated_round() const { return final_evaluated_round_; }
  double last_accuracy() const { return last_accuracy_; }

 private:
  std::string run_id_;
  double prior_elapsed_s_ = 0;
  std::vector<RoundMetrics> history_;
  bool clients_evaluate_ = false;
  int64_t final_evaluated_round_ = 0;
  double last_accuracy_ = 0;
};

}  // namespace cleave
