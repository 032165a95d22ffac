// SplitDriver: the synchronous round of split learning (split.mode). Each round it
// chooses a cut per client (fixed, or the cost model on the client's profile, the
// number of clients sharing the server part and the client's CutFeedback), creates the
// round's SplitRound, and publishes each client part as a blob: one per cut, built,
// encoded and hashed once and shared by every task at that cut (in `sl`, one per turn).
// Clients then stream activations through the transport's SplitReactor into the
// SplitRound; a client's upload is its trained part, which the driver hands to the
// SplitRound. At the round's end the measured step times feed the clients'
// CutFeedback, and the round's mean model enters the strategy as one update.
//
// split.mode: pipeline forms chains of up to split.devices clients each round: the data
// owners first (clients that serve no Peer, then those with the most examples), each
// followed by devices that serve Peer, placed by PlanPipeline from the devices' profiles
// (their speeds corrected by the compute each measured last round; a fixed split.cut is
// where the server's stages start, and a chain is then split.devices long). Each device's task
// names its neighbours and the hop's secret; the chain's last device streams to the
// server as a client does.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "models/model.h"
#include "server/rounds/round_context.h"
#include "server/rounds/round_driver.h"
#include "split/cut_policy.h"
#include "split/round.h"

namespace cleave {

struct SplitMetrics;  // server/server.h
class SecAggDriver;   // server/modes/secagg_driver.h

// The codec name split tensors carry for a compression.* value ("" = float32).
std::string SplitTensorCodec(const std::string& spec);

// A client's Profile against a model of `num_stages` stages: INVALID_ARGUMENT unless it
// has one finite time >= 0 per stage, finite links >= 0 and a memory limit >= 0.
Status CheckProfileValues(const v1::Profile& p, int num_stages);

class SplitDriver : public RoundDriver, public SplitStreams {
 public:
  explicit SplitDriver(RoundContext& ctx);
  ~SplitDriver() override;
  // The coordinator's mutex, which guards the driver's round state.
  Mutex& mu() const override ABSL_LOCK_RETURNED(ctx_.mu()) { return ctx_.mu(); }

  // Loads the mode, profiles the server's stages of `model`.
  Status InitLocked(const ModelSpec& spec, const Model& model) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // split.cut: auto, or a pipeline: clients must send a Profile before they take part.
  bool NeedsProfile() const override;
  int num_stages() const { return num_stages_; }
  // A client's Profile (stage times, link, memory): INVALID_ARGUMENT unless it has one
  // finite time >= 0 per stage and finite links >= 0. No lock.
  Status CheckProfile(const v1::Profile& p) const override;
  // Keeps the checked profile of session `client_id`, which may now take part.
  void ProfileLocked(const std::string& client_id, const v1::Profile& p) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // What crossed the cut this round (the transport counts it, without the lock).
  void CountUp(int64_t bytes) override { up_ += bytes; }
  void CountDown(int64_t bytes) override { down_ += bytes; }
  void CountLabels(int64_t labels) override { labels_ += labels; }

  // Chooses each client's cut and starts the round's SplitRound; a client no cut fits
  // is left out.
  Status ChooseLocked(int64_t round, const FitSettings& fit, std::vector<std::string>* clients)
      override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // A pipeline: each chain's weight (its data owner's, capped by the round's weights)
  // and, under secure aggregation, SecAgg+'s round over the masked layout.
  Status BeginLocked(int64_t round, const FitSettings& fit, const std::vector<std::string>& clients)
      override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void PrepareTaskLocked(v1::Task* task, TaskRecord* rec) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Split stats (times) finite and >= 0.
  Status CheckUploadLocked(const TaskRecord& t, const v1::UploadHeader& h) override;
  // Pipelines under secure aggregation: SecAgg+'s stages (secure_aggregation()), and the
  // masked inputs consumed whole.
  std::optional<Status> AwaitLocked(Clock::time_point deadline) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  bool TakeLocked(const v1::UploadHeader& h, const std::string& payload, const TaskRecord& t,
                  Status* status) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void ClientLeftLocked(const std::string& client_id) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // secure_aggregation with split.mode: pipeline: the driver of its stages (the
  // coordinator hands it the clients' stage messages); else null.
  SecAggDriver* secure_aggregation() override { return secagg_.get(); }
  SplitStreams* split_streams() override { return this; }
  // The client part the task was given: its upload is a delta from it.
  const ParameterSet* UploadLayoutLocked(const TaskRecord& t) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  AddUpload ClaimUploadLocked(const TaskRecord& t) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void AcceptedLocked(const TaskRecord& t, const v1::UploadHeader& h) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Its part is not averaged; in a pipeline, the tasks of its chain still running fail
  // too, at once (their hops go through it): the round need not wait for them.
  void TaskFailedLocked(const TaskRecord& t) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  bool ServesLocked(const std::string& client_id) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    return !NeedsProfile() || clients_.count(client_id) > 0;
  }
  // Its measured links and its last cut.
  void DescribeClientLocked(const std::string& client_id, ClientHealth* c) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void SessionEndedLocked(const std::string& client_id) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    clients_.erase(client_id);
  }
  void CloseLocked(int64_t round, RoundMetrics* m) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The change from `start` to the closed round's mean model, as one result.
  Status Fold(const ParameterSet& start, int64_t weight) override;
  bool ClientsEvaluate() const override { return false; }

  // A SplitOpen for a split task of the current round; one stream per task.
  StatusOr<SplitStreamTask> OpenLocked(const v1::SplitOpen& open) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // A split stream of the current round failed (bad message, lost connection).
  void EndedLocked(const SplitStreamTask& task, const Status& why) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());

 private:
  // The open round's client part at each cut and its published blob.
  struct PartBlob {
    std::shared_ptr<const ParameterSet> part;
    std::string digest;
    int64_t size = 0;
  };
  // Keyed by the stages [begin, cut) a part holds.
  using Segment = std::pair<int, int>;
  // A profiled client: what it measured, what the last cut's steps taught, and the
  // prediction of its last cut.
  struct ClientState {
    v1::Profile profile;
    CutFeedback feedback;
    CutPrediction prediction;
    // pipeline: measured over predicted compute per micro-batch (a running mean), which
    // divides its speed when the next round is planned.
    double pipeline_slowdown = 1;
    double pipeline_predicted_s = 0;  // its last segment's compute per micro-batch by its profile
  };
  // A split task: its cut, the client part it was given (without frozen tensors; its
  // upload is a delta from it; shared by the round's tasks at the same cut), whether its
  // stream opened, and the step times its upload reported.
  struct SplitTask {
    int begin = 0, cut = 0;
    std::shared_ptr<const ParameterSet> part;
    bool open = false;
    v1::SplitStats stats;
  };

  CutProblem ProblemFor(const v1::Profile& profile, int clients_in_round) const;
  // split.max_reconstruction_ssim, split.max_token_recovery: each cut's leakage
  // (MeasureReconstructionSsim or MeasureTokenRecovery on the server's test data through
  // the initial client part) into model_problem_.
  Status MeasureLeakage(const ModelSpec& spec, const ParameterSet& model);
  // split.hijack: the attack (FeatureSpaceHijack) on the server's test inputs, into hijack_.
  Status StartHijack(const ModelSpec& spec);
  // The round's SplitRound options for the clients' `fit` (what every mode shares).
  SplitRoundOptions RoundOptionsLocked(const FitSettings& fit) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // split.mode: pipeline: the round's chains from `clients`, which become their devices.
  Status BeginPipelineLocked(int64_t round, const FitSettings& fit, std::vector<std::string>* clients)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Its chain's devices and bounds, by PlanPipeline from the profiles (a fixed split.cut:
  // exactly split.devices devices holding [0, cut)); `pool` (devices serving Peer) loses
  // those it takes. FAILED_PRECONDITION when no plan fits the devices' memory.
  StatusOr<SplitChain> PlanChainLocked(int64_t round, const std::string& owner, std::vector<std::string>* pool,
                                       int chains) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Chain `index`'s hops: each device's stages, neighbours and their secrets (hops_),
  // its devices appended to `chosen`.
  void WireChainLocked(int64_t round, int index, const SplitChain& chain, std::vector<std::string>* chosen)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The pipeline's round metrics: each chain's devices, their busy shares and bubble.
  void ClosePipelineLocked(int64_t round, SplitMetrics* sm) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Builds `client_id`'s part of `segment` into `pb` and publishes its blob (a LoRA part
  // without its frozen tensors, whose base is pinned once per segment).
  void PublishPartLocked(const std::string& client_id, const Segment& segment, PartBlob* pb)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // A quantized base's weights of `segment`'s stages (and the head's for the data owner),
  // pinned once per segment: their blob's digest and size.
  const std::pair<std::string, int64_t>& QuantizedBaseLocked(const Segment& segment)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());

  RoundContext& ctx_;
  // Fixed by Init.
  SplitMode mode_ = SplitMode::kSl;
  int num_stages_ = 0;
  int tail_begin_ = 0;
  int num_classes_ = 10;
  std::vector<StageProfile> server_profile_;
  std::vector<std::vector<int64_t>> stage_shapes_;  // per-sample input of stage s, s <= n
  CutProblem model_problem_;  // the cost model's model- and server-side inputs
  std::shared_ptr<FeatureSpaceHijack> hijack_;  // split.hijack's, else null

  std::map<std::string, ClientState> clients_ ABSL_GUARDED_BY(ctx_.mu());  // by session id
  std::map<std::string, SplitTask> tasks_ ABSL_GUARDED_BY(ctx_.mu());  // the round's, by id
  std::atomic<int64_t> up_{0}, down_{0}, labels_{0};  // the round's (RoundMetrics)
  std::shared_ptr<SplitRound> round_ ABSL_GUARDED_BY(ctx_.mu());  // the open round
  std::shared_ptr<SplitRound> closed_;  // the closed round, for Fold (round thread)
  std::map<Segment, PartBlob> part_blobs_ ABSL_GUARDED_BY(ctx_.mu());
  // LoRA: each segment's frozen tensors (digest, size of the pinned blob), all run long.
  std::map<Segment, std::pair<std::string, int64_t>> cut_bases_ ABSL_GUARDED_BY(ctx_.mu());
  // A quantized base: each segment's quantized weights (digest, size of the pinned blob).
  std::map<Segment, std::pair<std::string, int64_t>> cut_quantized_ ABSL_GUARDED_BY(ctx_.mu());
  // pipeline: the round's chains, and each device's place in its chain (its task's
  // begin, micro_batches, neighbours and chain), by session id.
  std::vector<SplitChain> chains_ ABSL_GUARDED_BY(ctx_.mu());
  // pipeline under secure aggregation: every device masks one vector, the concatenation
  // of the update layout's tensors that some device of the round trains (each device's
  // own at their offsets, zeros elsewhere), scaled by its chain's weight.
  struct MaskedLayout {
    struct Slot {
      int64_t offset = 0, size = 0;
    };
    std::map<std::string, Slot> slots;  // by tensor name
    int64_t length = 0;
    // What each device masks: its chain's weight and its tensors, by session id.
    struct Holder {
      int64_t weight = 0;
      std::vector<std::string> tensors;
    };
    std::map<std::string, Holder> holders;
  };
  std::unique_ptr<SecAggDriver> secagg_;
  MaskedLayout masked_ ABSL_GUARDED_BY(ctx_.mu());  // the open round's
  MaskedLayout masked_closed_;                      // the closed round's, for Fold
  std::map<std::string, v1::SplitTask> hops_ ABSL_GUARDED_BY(ctx_.mu());
  // Each device's weight: its chain's data owner's declared examples (a device past the
  // owner trains on the owner's data, and reports 1).
  std::map<std::string, int64_t> chain_weights_ ABSL_GUARDED_BY(ctx_.mu());
};

}  // namespace cleave
