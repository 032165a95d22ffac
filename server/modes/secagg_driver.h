// SecAggDriver: the synchronous round under secure aggregation (SecAgg+). The round's
// clients are given the masked-input codec and the stage's message with their tasks;
// while they train, the driver closes each stage when it is complete or at its deadline
// and sends the next one's messages; masked inputs are added into the round's sum mod M
// as they arrive; when the unmasking closes, the unmasked, dequantized sum enters the
// strategy as one update weighted by the survivors' examples, so server optimizers work
// unchanged. The stages' protocol state is server/modes/secagg_round.h (no gRPC).
#pragma once

#include <memory>

#include "server/modes/secagg_round.h"
#include "server/rounds/round_context.h"
#include "server/rounds/round_driver.h"

namespace cleave {

// The codec name of a masked secure-aggregation input in UploadHeader.codec.
inline constexpr char kSecAggCodec[] = "secagg";

class SecAggDriver : public RoundDriver {
 public:
  explicit SecAggDriver(RoundContext& ctx) : ctx_(ctx) {}
  // The coordinator's mutex, which guards the driver's round state.
  Mutex& mu() const ABSL_LOCK_RETURNED(ctx_.mu()) { return ctx_.mu(); }

  Status BeginLocked(int64_t round, const FitSettings& fit, const std::vector<std::string>& clients)
      override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Starts the round's SecAgg+ over `clients` with masked vectors of `length` values,
  // each scaled by its weight over `max_weight` (BeginLocked: the update layout's length
  // and the largest weight of the clients' declared examples).
  Status StartLocked(int64_t round, const std::vector<std::string>& clients, int64_t length, int64_t max_weight)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Per-slice masking (width-scaled submodels), after StartLocked: each client's slice.
  Status SetSlicesLocked(const std::map<std::string, std::shared_ptr<const SecAggSlice>>& slices)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void PrepareTaskLocked(v1::Task* task, TaskRecord* rec) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Drives the stages until the unmasking closes (OK) or the round cannot go on; masked
  // inputs are due by `deadline`, each other stage within
  // secure_aggregation.stage_timeout_s. Releases the mutex while sending.
  std::optional<Status> AwaitLocked(Clock::time_point deadline) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // A masked input (codec "secagg"): checked and added into the round's sum.
  bool TakeLocked(const v1::UploadHeader& h, const std::string& payload, const TaskRecord& t,
                  Status* status) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void TaskFailedLocked(const TaskRecord& t) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    ClientLeftLocked(t.client_id);
  }
  void ClientLeftLocked(const std::string& client_id) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    if (round_) round_->Drop(client_id);
  }
  void CloseLocked(int64_t round, RoundMetrics* m) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Unmasks the closed round's sum into the strategy.
  Status Fold(const ParameterSet& start, int64_t weight) override;
  // The closed round's unmasked sum (of weight / max_weight x each survivor's vector),
  // its survivors and max_weight; once (Fold takes it too).
  struct Unmasked {
    std::vector<double> sum;
    std::vector<std::string> survivors;
    int64_t max_weight = 1;
  };
  StatusOr<Unmasked> TakeUnmasked();
  // Clients report no evaluation under secure aggregation (one client's numbers would
  // show what masking hides).
  bool ClientsEvaluate() const override { return false; }
  SecAggDriver* secure_aggregation() override { return this; }
  // Distributed DP and aggregation.weighting: equal: every masked update counts the same
  // (each client's scale is 1); otherwise its examples over the round's max_weight.
  bool UniformWeights() const;

  // A stage message (keys, shares or revealed shares) of `task_id`, checked against
  // what the stage expects from `client_id` before any state changes.
  Status SubmitLocked(const v1::SecAggRequest& req) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());

 private:
  RoundContext& ctx_;
  std::unique_ptr<SecAggRound> round_ ABSL_GUARDED_BY(ctx_.mu());  // the open round's
  // The closed round's, for Fold (the round thread's alone by then).
  std::unique_ptr<SecAggRound> closed_;
};

}  // namespace cleave
