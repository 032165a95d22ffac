// WidthDriver: the synchronous round of width-scaled submodels (job section width;
// HeteroFL, Diao et al. 2021; FedRolex, Alam et al. 2022). Each device trains the
// submodel of its rate (width.clients pins it by name, else width.rate): every hidden
// layer's leading channels or features (heterofl), or a window of them that moves on by
// one each round and wraps around (fedrolex), so that every part of the whole model is
// trained. Its task's model is the submodel, published as a blob per rate; its upload,
// the submodel's delta, is placed back element by element (aggregation/submodel.h), and
// the round's mean, per element over the devices that hold it, enters the strategy as one
// update. A device that cannot hold its rate refuses the task (--memory-limit-mb).
//
// With width.assign: profile a device not pinned by name sends a Profile when it joins
// (its time per batch of the whole model, its link, its memory budget) and gets the
// largest of width.rates whose training fits its memory and, with width.max_task_s, whose
// task would take no longer (local steps at its measured speed scaled by the rate's
// share of the server's time per batch, plus the rate's model down and its delta up over
// its measured link). A device no rate fits is left out with the reason.
//
// With width.method hetlora or flexlora a rate is a fraction of model.lora.rank
// (models/lora_ranks.h): the task's model is the leading block of the federation's
// adapters at the device's rank, and the round aggregates by HetLoRA's zero-padded mean
// or FlexLoRA's SVD of the mean product.
//
// A robust aggregation.rule applies element by element over the devices that hold each
// element (SubmodelUpdates: median, trimmed_mean, norm_bound), instead of the mean.
//
// With secure_aggregation (SecAgg+, through a SecAggDriver it composes) each device
// masks its submodel's delta alone (per-slice masking): the server tells it where its
// values and its neighbours' sit in the whole model's update layout (SecAggTask.placement,
// SecAggPeer.placement), each pair mask covers the positions both hold, and the server
// adds each masked input at its positions, so the masks cancel in one sum. It divides
// each element of the unmasked sum by the weights of the survivors that hold it.
//
// An edge aggregator (Join.edge) is a device of rate 1 whose upload is its devices'
// per-element mean followed by each element's share of its weight, in [0, 1]
// (kEdgeWeightSuffix, proto/edge_weights.h), added per element at the edge's bounded weight
// (SubmodelSum::AddWeighted). As an edge itself, the driver keeps each round's
// per-element weights (ElementWeights) for the edge to hand up.
//
// With dp (DP-FedAvg, central noise) each upload goes to the strategy zero-padded to the
// whole model (Placed), where it is clipped like any update: a device's sensitivity is
// its submodel's clipped norm. The round tells the strategy each element's holders
// (SetHolders), so the noised sum is divided per element by the devices that hold it.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "aggregation/submodel.h"
#include "data/dataset.h"
#include "models/lora_ranks.h"
#include "server/rounds/round_context.h"
#include "server/rounds/round_driver.h"
#include "split/cut_policy.h"

namespace cleave {

class SecAggDriver;  // server/modes/secagg_driver.h
struct SecAggSlice;  // server/modes/secagg_round.h

// Where `sub`, a width-scaled submodel of the model `spec` describes, sits in `whole` (the
// whole model's layout) with its windows at `roll` (FedRolex's round - 1; 0: HeteroFL's
// leading windows): a decoder's heads and MLP features (DecoderKept, with the head size
// and query-head groups of `spec`), another model's channels and features (SubmodelKept).
StatusOr<std::vector<Kept>> SubmodelKeptOf(const ModelSpec& spec, const ParameterSet& whole, const ParameterSet& sub,
                                           int64_t roll);

class WidthDriver : public RoundDriver {
 public:
  explicit WidthDriver(RoundContext& ctx);
  ~WidthDriver() override;

  // The rate of each of the round's clients, their submodels, and the round's sum; an
  // error (a rate the model has no submodel for) fails the round.
  Status BeginLocked(int64_t round, const FitSettings& fit, const std::vector<std::string>& clients)
      override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The task's rate and submodel (a blob per rate this round).
  void PrepareTaskLocked(v1::Task* task, TaskRecord* rec) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // An upload is its submodel's delta.
  const ParameterSet* UploadLayoutLocked(const TaskRecord& t) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  AddUpload ClaimUploadLocked(const TaskRecord& t) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // Under secure aggregation: its stages, and the masked inputs consumed whole.
  std::optional<Status> AwaitLocked(Clock::time_point deadline) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  bool TakeLocked(const v1::UploadHeader& h, const std::string& payload, const TaskRecord& t,
                  Status* status) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void TaskFailedLocked(const TaskRecord& t) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void ClientLeftLocked(const std::string& client_id) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  SecAggDriver* secure_aggregation() override { return secagg_.get(); }
  // The last round's per-element weights (this server as an edge aggregator).
  ParameterSet ElementWeights() const override { return last_weights_; }
  void CloseLocked(int64_t round, RoundMetrics* m) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The round's per-element mean delta, as one update.
  Status Fold(const ParameterSet& start, int64_t weight) override;
  // A client's evaluation would be of its submodel, not of the model the server holds.
  bool ClientsEvaluate() const override { return false; }

  // scheduler.mode: async: the buffer's sums and every configured rate's submodel of
  // model version `version`; uploads of earlier versions' tasks are placed by their own
  // version's windows.
  Status BufferOpenedLocked(int64_t version) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // width.assign: profile: measures each of width.rates' cost once, before anything is
  // served (the memory estimate reads the process's heap, which other threads disturb).
  Status PrepareLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  bool NeedsProfile() const override;
  Status CheckProfile(const v1::Profile& p) const override;
  void ProfileLocked(const std::string& client_id, const v1::Profile& p) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  bool ServesLocked(const std::string& client_id) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void SessionEndedLocked(const std::string& client_id) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());

  // The rate of session `s`: pinned by its name, else assigned from its profile, else
  // width.rate.
  double RateOfLocked(const Session& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The LoRA rank of `rate` (width.method hetlora or flexlora).
  int64_t RankOf(double rate) const;

 private:
  // Where a rate's submodel sits in the whole model in some round: per tensor, the whole
  // tensor's indices it keeps per dimension, and its elements' flat positions.
  struct Placement {
    std::vector<Kept> kept;
    std::shared_ptr<const std::vector<std::vector<int64_t>>> positions;
    // Secure aggregation: where its values sit in the whole update layout, made once.
    std::shared_ptr<const SecAggSlice> slice;
  };
  // A rate's placement for tasks of round (version) `round` (FedRolex's window moves with
  // it), made once.
  StatusOr<std::shared_ptr<const Placement>> PlacementLocked(double rate, int64_t round)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // A rate's submodel this round: its values (the round's model) at its placement, and
  // the blob they are published as.
  struct Submodel {
    std::shared_ptr<const ParameterSet> part;
    std::shared_ptr<const Placement> placement;
    std::string digest;
    int64_t size = 0;
  };
  StatusOr<Submodel*> SubmodelLocked(double rate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // An edge aggregator's upload layout: the start's tensors, then their weight shares.
  const ParameterSet& EdgeLayoutLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // A round (or async buffer) `round` opens: its start, its sums, no submodels yet.
  Status OpenLocked(int64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The layout (shapes; values unused) of what a device of `rate` trains, made once.
  StatusOr<const ParameterSet*> LayoutLocked(double rate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The model a device of `rate` trains.
  ModelSpec SpecAt(double rate) const;
  // What training a rate's model takes on the server (memory, seconds per batch) and the
  // bytes of its trained tensors, measured once (PrepareLocked).
  struct RateCost {
    TrainingCost cost;
    int64_t bytes = 0;
  };
  StatusOr<const RateCost*> CostLocked(double rate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The largest of width.rates session `s`'s profile admits; FAILED_PRECONDITION, with
  // why, when none does.
  StatusOr<double> ChooseRateLocked(const Session& s, const v1::Profile& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());

  RoundContext& ctx_;
  int64_t round_ ABSL_GUARDED_BY(ctx_.mu()) = 0;
  std::map<double, ParameterSet> layouts_ ABSL_GUARDED_BY(ctx_.mu());  // each rate's, all run long
  std::map<double, RateCost> costs_ ABSL_GUARDED_BY(ctx_.mu());        // likewise
  std::map<std::string, double> assigned_ ABSL_GUARDED_BY(ctx_.mu());  // from profiles, by session id
  std::map<double, Submodel> submodels_ ABSL_GUARDED_BY(ctx_.mu());    // the round's, by rate
  std::map<std::string, double> rates_ ABSL_GUARDED_BY(ctx_.mu());     // the round's, by session id
  // By (rate, roll): this round's and, async, those of the versions tasks may answer.
  std::map<std::pair<double, int64_t>, std::shared_ptr<const Placement>> placements_ ABSL_GUARDED_BY(ctx_.mu());
  // The round's start in the update layout (LoRA: the adapters, without the frozen base).
  ParameterSet start_ ABSL_GUARDED_BY(ctx_.mu());
  ParameterSet edge_layout_ ABSL_GUARDED_BY(ctx_.mu());  // an edge's upload: the start's, then weights
  // width.distill: the devices' trained submodels, by rate, added as they upload.
  struct Teachers {
    mutable Mutex mu;
    std::vector<std::pair<double, ParameterSet>> models ABSL_GUARDED_BY(mu);
  };
  // What a round adds its uploads into: exactly one of FlexLoRA's products, the
  // elements kept whole for a robust aggregation.rule, every other method's sums, or
  // none: (dp) the strategy adds them, and `holders` counts each element's devices as
  // the round closes; (secure aggregation) the SecAggDriver sums the masked vectors, and
  // `masked` keeps each accepted device's rate and weight for the per-element division.
  // FedDF's teachers besides, with width.distill.
  struct Sums {
    std::shared_ptr<SubmodelSum> sum;
    std::shared_ptr<FlexLoraSum> products;
    std::shared_ptr<SubmodelUpdates> updates;
    std::shared_ptr<Teachers> teachers;
    bool dp = false;
    ParameterSet holders;
    // Secure aggregation: each accepted device's rate and weight, by session id.
    std::map<std::string, std::pair<double, int64_t>> masked;
    std::map<double, std::shared_ptr<const std::vector<std::vector<int64_t>>>> positions;  // by rate
    int64_t round = 0;
  };
  Sums sums_ ABSL_GUARDED_BY(ctx_.mu());  // the open round's
  Sums closed_;                           // the closed round's, for Fold (round thread)
  // FedDF's step on `whole`, round `round`'s aggregate (round thread): distilled in place.
  Status DistillInto(ParameterSet* whole, const Teachers& teachers, int64_t round);
  std::optional<Dataset> distill_data_;  // width.distill.data, loaded at the first round
  std::unique_ptr<SecAggDriver> secagg_;  // with secure_aggregation
  ParameterSet last_weights_;             // the last folded round's, per element (round thread)
};

}  // namespace cleave
