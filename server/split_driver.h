// SplitDriver: the synchronous round of split learning (split.mode). Each round it
// chooses a cut per client (fixed, or the cost model on the client's profile, the
// number of clients sharing the server part and the client's CutFeedback), creates the
// round's SplitRound, and publishes each client part as a blob: one per cut, built,
// encoded and hashed once and shared by every task at that cut (in `sl`, one per turn).
// Clients then stream activations through the transport's SplitReactor into the
// SplitRound; a client's upload is its trained part, which the driver hands to the
// SplitRound. At the round's end the measured step times feed the clients'
// CutFeedback, and the round's mean model enters the strategy as one update.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/coordinator.h"
#include "server/round_driver.h"
#include "split/cut_policy.h"
#include "split/round.h"

namespace cleave {

class SplitDriver : public RoundDriver {
 public:
  explicit SplitDriver(Coordinator& c) : c_(c) {}
  // The coordinator's mutex, which guards the driver's round state.
  Mutex& mu() const ABSL_LOCK_RETURNED(c_.mu_) { return c_.mu_; }

  // Loads the mode, profiles the server's stages, publishes the probe blob (auto cut).
  Status Init(const ModelSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_.mu_);
  // split.cut: auto: clients must send a Profile before they take part.
  bool NeedProfile() const { return c_.cfg_.split.cut == 0; }
  int num_stages() const { return num_stages_; }
  const std::string& probe_digest() const { return probe_digest_; }

  // Chooses each client's cut and starts the round's SplitRound; a client no cut fits
  // is left out.
  Status BeginLocked(int64_t round, const FitSettings& fit, std::vector<std::string>* clients)
      override ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_.mu_);
  void PrepareTaskLocked(v1::Task* task, TaskRecord* rec) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_.mu_);
  AddUpload ClaimUploadLocked(const TaskRecord& t) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_.mu_);
  void TaskFailedLocked(const TaskRecord& t) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_.mu_) {
    if (t.split && round_) round_->Fail(t.client_id);
  }
  void CloseLocked(int64_t round, RoundMetrics* m) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_.mu_);
  // The change from `start` to the closed round's mean model, as one result.
  Status Fold(const ParameterSet& start, int64_t weight) override;
  bool ClientsEvaluate() const override { return false; }

  // A SplitOpen for a split task of the current round; one stream per task.
  StatusOr<SplitStreamTask> OpenLocked(const v1::SplitOpen& open)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_.mu_);
  // A split stream of the current round failed (bad message, lost connection).
  void EndedLocked(const SplitStreamTask& task, const Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(c_.mu_);

 private:
  CutProblem ProblemFor(const Session& s, int clients_in_round) const;

  Coordinator& c_;
  // Fixed by Init.
  SplitMode mode_ = SplitMode::kSl;
  int num_stages_ = 0;
  int tail_begin_ = 0;
  int num_classes_ = 10;
  std::vector<StageProfile> server_profile_;
  std::vector<std::vector<int64_t>> stage_shapes_;  // per-sample input of stage s, s <= n
  CutProblem model_problem_;  // the cost model's model- and server-side inputs
  std::string probe_digest_;

  std::shared_ptr<SplitRound> round_ ABSL_GUARDED_BY(c_.mu_);  // the open round
  std::shared_ptr<SplitRound> closed_;  // the closed round, for Fold (round thread)
  // The open round's client part at each cut and its published blob.
  struct PartBlob {
    std::shared_ptr<const ParameterSet> part;
    std::string digest;
    int64_t size = 0;
  };
  std::map<int, PartBlob> part_blobs_ ABSL_GUARDED_BY(c_.mu_);
  // LoRA: each cut's frozen tensors (digest, size of the pinned blob), all run long.
  std::map<int, std::pair<std::string, int64_t>> cut_bases_ ABSL_GUARDED_BY(c_.mu_);
};

}  // namespace cleave
