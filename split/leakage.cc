#include "split/leakage.h"

#include <algorithm>
#include <memory>
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

StatusOr<double> MeasureTokenRecovery(const ClientPartView& view, const Dataset& aux, const LeakageOptions& o) {
  if (!view.spec.text() || aux.type != ExampleType::kToken) {
    return absl::InvalidArgumentError("token recovery is measured for a decoder on token sequences");
  }
  const int64_t train = std::min(o.train_images, aux.size - o.probe_images);
  if (train < 2 || o.probe_images < 1) {
    return absl::InvalidArgumentError(absl::StrCat("the auxiliary data hold ", aux.size, " sequences: too few to "
                                                   "measure what a cut leaks"));
  }
  std::vector<int64_t> train_idx(train), probe_idx(o.probe_images);
  std::iota(train_idx.begin(), train_idx.end(), 0);
  std::iota(probe_idx.begin(), probe_idx.end(), train);
  InversionOptions learned;
  learned.steps = o.steps;
  learned.batch = 16;
  learned.hidden = 256;
  ASSIGN_OR_RETURN(Activations sent, ClientActivations(view, InputBatch(aux, probe_idx), /*seed=*/2));
  const std::vector<int64_t> labels = BatchLabels(aux, probe_idx);
  ASSIGN_OR_RETURN(std::unique_ptr<LearnedTokenInverter> inverter,
                   LearnedTokenInverter::Train(view, InputBatch(aux, train_idx), learned));
  ASSIGN_OR_RETURN(std::vector<int64_t> guessed, inverter->Invert(sent));
  double rate = ScoreTokens(guessed, labels, sent.shape[1]).rate();
  if (view.cut == 1) {
    SplitRecord r;
    r.part = view.part;
    r.batches.push_back({Tensor{"", sent.shape, sent.values}, labels, {}});
    ASSIGN_OR_RETURN(TokenRecovery nearest, RecoverTokensAtTheEmbedding(r));
    rate = std::max(rate, nearest.rate());
  }
  return rate;
}

}  // namespace cleave
