// How much a round's client updates disagree, against how much they agree: the input of
// the daemon's goodput scheduler (service/scheduler.h). It is the federated form of the
// gradient noise scale (McCandlish et al., "An Empirical Model of Large-Batch Training",
// 2018, appendix A; Pollux's statistical efficiency): an update is the expected update G
// plus noise of variance sigma^2, and from the weighted mean squared norm A of the
// updates and the squared norm B of their weighted mean (n_eff = W^2 / sum w^2)
//   sigma^2 = (A - B) / (1 - 1 / n_eff),   |G|^2 = B - sigma^2 / n_eff,
// and sigma^2 / |G|^2 is the number of clients whose mean update is as much signal as
// noise. Measured only where the server's step is the updates' plain weighted mean
// (MeasuresUpdateNoise).
#pragma once

#include <optional>
#include <vector>

#include "core/mutex.h"
#include "core/parameter_set.h"
#include "server/server.h"

namespace cleave {

struct FederationConfig;

// Whether the server's step in `config` is its updates' plain weighted mean, B above:
// fedavg or fedprox with server_lr 1, aggregation.rule mean, scheduler.mode sync, no dp,
// secure aggregation, split learning or width-scaled submodels.
bool MeasuresUpdateNoise(const FederationConfig& config);

// One round's tally; Add from any thread.
class UpdateNoiseMeter {
 public:
  void Reset() ABSL_LOCKS_EXCLUDED(mu_);
  // An accepted update of `weight`, read through its views.
  void Add(const std::vector<TensorView>& update, double weight) ABSL_LOCKS_EXCLUDED(mu_);
  // The estimate, given B: the squared norm of the weighted mean of the updates added
  // since Reset. None with fewer than two updates (nothing to compare).
  std::optional<UpdateNoise> Estimate(double mean_squared_norm) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable Mutex mu_;
  double weight_ ABSL_GUARDED_BY(mu_) = 0;          // W
  double squared_weight_ ABSL_GUARDED_BY(mu_) = 0;  // sum w^2
  double weighted_norm_ ABSL_GUARDED_BY(mu_) = 0;   // sum w |update|^2
  int count_ ABSL_GUARDED_BY(mu_) = 0;
};

// sum over `a`'s tensors of |a - b|^2, each against `b`'s tensor of its name (one `b`
// lacks, or of another size, is left out).
double SquaredDistance(const ParameterSet& a, const ParameterSet& b);

}  // namespace cleave
