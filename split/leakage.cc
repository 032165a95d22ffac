#include "split/leakage.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "models/part.h"
#include "split/attacks.h"

namespace cleave {

StatusOr<double> MeasureReconstructionSsim(const ClientPartView& view, const Dataset& aux,
                                           const LeakageOptions& o) {
  if (aux.shape != view.spec.input_shape || aux.shape.size() != 3) {
    return absl::InvalidArgumentError("the auxiliary data are not the model's input images");
  }
  const int64_t train = std::min(o.train_images, aux.size - o.probe_images);
  if (train < 2 || o.probe_images < 1) {
    return absl::InvalidArgumentError(absl::StrCat("the auxiliary data hold ", aux.size, " images: too few to measure "
                                                   "what a cut leaks"));
  }
  std::vector<int64_t> train_idx(train), probe_idx(o.probe_images);
  std::iota(train_idx.begin(), train_idx.end(), 0);
  std::iota(probe_idx.begin(), probe_idx.end(), train);
  const Activations train_in = InputBatch(aux, train_idx), probe = InputBatch(aux, probe_idx);
  InversionOptions learned;
  learned.steps = o.steps;
  learned.hidden = o.hidden;
  SetInputRange(aux, &learned);
  InversionOptions optimised = learned;
  optimised.steps = o.optimise_steps;
  optimised.lr = 0.05;
  optimised.tv = 0.05;
  ASSIGN_OR_RETURN(Activations sent, ClientActivations(view, probe, /*seed=*/2));
  ASSIGN_OR_RETURN(std::unique_ptr<LearnedInverter> inverter, LearnedInverter::Train(view, train_in, learned));
  ASSIGN_OR_RETURN(Activations by_learned, inverter->Invert(sent));
  double ssim = MeanSsim(probe.values, by_learned.values, probe.batch(), aux.shape, aux);
  if (o.optimise_steps > 0) {
    ASSIGN_OR_RETURN(Activations by_optimisation, InvertByOptimisation(view, sent, optimised));
    ssim = std::max(ssim, MeanSsim(probe.values, by_optimisation.values, probe.batch(), aux.shape, aux));
  }
  return ssim;
}

}  // namespace cleave
