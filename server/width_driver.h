// WidthDriver: the synchronous round of width-scaled submodels (job section width;
// HeteroFL, Diao et al. 2021; FedRolex, Alam et al. 2022). Each device trains the
// submodel of its rate (width.clients pins it by name, else width.rate): every hidden
// layer's leading channels or features (heterofl), or a window of them that moves on by
// one each round and wraps around (fedrolex), so that every part of the whole model is
// trained. Its task's model is the submodel, published as a blob per rate; its upload,
// the submodel's delta, is placed back element by element (aggregation/submodel.h), and
// the round's mean, per element over the devices that hold it, enters the strategy as one
// update. A device that cannot hold its rate refuses the task (--memory-limit-mb).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "aggregation/submodel.h"
#include "server/round_context.h"
#include "server/round_driver.h"

namespace cleave {

class WidthDriver : public RoundDriver {
 public:
  explicit WidthDriver(RoundContext& ctx) : ctx_(ctx) {}

  // The rate of each of the round's clients, their submodels, and the round's sum; an
  // error (a rate the model has no submodel for) fails the round.
  Status BeginLocked(int64_t round, const FitSettings& fit, std::vector<std::string>* clients)
      override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The task's rate and submodel (a blob per rate this round).
  void PrepareTaskLocked(v1::Task* task, TaskRecord* rec) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // An upload is its submodel's delta.
  const ParameterSet* UploadLayoutLocked(const TaskRecord& t) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  AddUpload ClaimUploadLocked(const TaskRecord& t) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  void CloseLocked(int64_t round, RoundMetrics* m) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());
  // The round's per-element mean delta, as one update.
  Status Fold(const ParameterSet& start, int64_t weight) override;
  // A client's evaluation would be of its submodel, not of the model the server holds.
  bool ClientsEvaluate() const override { return false; }

  // The rate of a client named `name`.
  double RateOf(const std::string& name) const;

 private:
  // A rate's submodel this round: its layout (values: the round's model) and where its
  // tensors sit in the whole model's.
  struct Submodel {
    std::shared_ptr<const ParameterSet> part;
    std::shared_ptr<const std::vector<std::vector<int64_t>>> positions;
    std::string digest;
    int64_t size = 0;
  };
  StatusOr<Submodel*> SubmodelLocked(double rate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu());

  RoundContext& ctx_;
  int64_t round_ ABSL_GUARDED_BY(ctx_.mu()) = 0;
  std::map<double, ParameterSet> layouts_ ABSL_GUARDED_BY(ctx_.mu());  // each rate's, all run long
  std::map<double, Submodel> submodels_ ABSL_GUARDED_BY(ctx_.mu());    // the round's, by rate
  std::map<std::string, double> rates_ ABSL_GUARDED_BY(ctx_.mu());     // the round's, by session id
  std::map<std::string, double> task_rates_ ABSL_GUARDED_BY(ctx_.mu());  // by task id
  std::shared_ptr<SubmodelSum> sum_ ABSL_GUARDED_BY(ctx_.mu());
  std::shared_ptr<SubmodelSum> closed_;  // the closed round's, for Fold (round thread)
};

}  // namespace cleave
