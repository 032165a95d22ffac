#include "split/leakage.h"

#include <algorithm>
#include <memory>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "models/part.h"
#include "split/attacks.h"

namespace cleave {
namespace {

// The auxiliary examples the attacker trains on (the first options.train_images, less
// what the probe needs) and those it is scored on (the next options.probe_images).
struct AuxSplit {
  std::vector<int64_t> train, probe;
};
StatusOr<AuxSplit> SplitAux(const Dataset& aux, const LeakageOptions& o) {
  const int64_t train = std::min(o.train_images, aux.size - o.probe_images);
  if (train < 2 || o.probe_images < 1) {
    return absl::InvalidArgumentError(absl::StrCat("the auxiliary data hold ", aux.size, " examples: too few to "
                                                   "measure what a cut leaks"));
  }
  AuxSplit s{std::vector<int64_t>(train), std::vector<int64_t>(o.probe_images)};
  std::iota(s.train.begin(), s.train.end(), 0);
  std::iota(s.probe.begin(), s.probe.end(), train);
  return s;
}

}  // namespace

StatusOr<double> MeasureReconstructionSsim(const ClientPartView& view, const Dataset& aux,
                                           const LeakageOptions& o) {
  if (aux.shape != view.spec.input_shape || aux.shape.size() != 3) {
    return absl::InvalidArgumentError("the auxiliary data are not the model's input images");
  }
  ASSIGN_OR_RETURN(const AuxSplit split, SplitAux(aux, o));
  const Activations train_in = InputBatch(aux, split.train), probe = InputBatch(aux, split.probe);
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

StatusOr<double> MeasureTokenRecovery(const ClientPartView& view, const Dataset& aux, const LeakageOptions& o) {
  if (!view.spec.text() || aux.type != ExampleType::kToken) {
    return absl::InvalidArgumentError("token recovery is measured for a decoder on token sequences");
  }
  ASSIGN_OR_RETURN(const AuxSplit split, SplitAux(aux, o));
  InversionOptions learned;
  learned.steps = o.steps;
  learned.batch = 16;
  learned.hidden = 256;
  ASSIGN_OR_RETURN(Activations sent, ClientActivations(view, InputBatch(aux, split.probe), /*seed=*/2));
  const std::vector<int64_t> labels = BatchLabels(aux, split.probe);
  ASSIGN_OR_RETURN(std::unique_ptr<LearnedTokenInverter> inverter,
                   LearnedTokenInverter::Train(view, InputBatch(aux, split.train), learned));
  ASSIGN_OR_RETURN(std::vector<int64_t> guessed, inverter->Invert(sent));
  double rate = ScoreTokens(guessed, labels, sent.shape[1]).rate();
  if (view.cut == 1) {
    SplitRecord r;
    r.part = view.part;
    r.batches.push_back({Tensor{"", sent.shape, sent.values}, labels, {}, {}});
    ASSIGN_OR_RETURN(TokenRecovery nearest, RecoverTokensAtTheEmbedding(r));
    rate = std::max(rate, nearest.rate());
  }
  return rate;
}

}  // namespace cleave
