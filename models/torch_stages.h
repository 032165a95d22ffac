// Internal to models/ (includes LibTorch; never include it from a public header): a
// model as its list of stages, each callable on its own, so that a range of stages can
// be trained as one part of a cut model.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "models/model.h"

namespace cleave {

struct TorchStage {
  // This stage's tensors (parameters, then floating-point buffers such as BatchNorm's
  // running statistics) named as in the whole model ("3.0.weight").
  std::function<std::vector<std::pair<std::string, torch::Tensor>>()> parameters;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::function<void(bool)> train;
};

// Builds the model `spec` names (initialised from spec.seed, exactly as Model::Create
// does) and returns its stages in order.
StatusOr<std::vector<TorchStage>> BuildTorchStages(const ModelSpec& spec);

}  // namespace cleave
