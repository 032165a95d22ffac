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
#include "models/llama.h"
#include "models/model.h"

namespace cleave {

// Appends the floating-point buffers (BatchNorm's running statistics; not its integer
// batch counter) to `out`: the tensors FedAvg averages besides the parameters.
template <typename Named>
void AppendFloatBuffers(const Named& buffers, const std::string& prefix,
                        std::vector<std::pair<std::string, torch::Tensor>>& out) {
  for (const auto& b : buffers) {
    if (b.value().is_floating_point()) out.emplace_back(prefix + b.key(), b.value());
  }
}

struct TorchStage {
  // This stage's tensors (parameters, then floating-point buffers such as BatchNorm's
  // running statistics) named as in the whole model ("3.0.weight").
  std::function<std::vector<std::pair<std::string, torch::Tensor>>()> parameters;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::function<void(bool)> train;
  // Activation checkpointing of its decoder blocks (train.recompute); a no-op elsewhere.
  std::function<void(bool)> recompute;
  // Its weights held quantized (ModelSpec::quantize), named as in the whole model.
  std::function<std::vector<std::pair<std::string, QuantizedWeight*>>()> quantized;
};

// Builds the model `spec` names (initialised from spec.seed, exactly as Model::Create
// does) and returns its stages in order. With a range [begin, end), a model that can
// builds only those stages (BuildBuiltin) and the others have no tensors. A head tied to
// the embedding lists the embedding's weight among its tensors too (under stage 0's
// name): a part that holds the head without stage 0 needs it; where both are held, the
// first is the one.
StatusOr<std::vector<TorchStage>> BuildTorchStages(const ModelSpec& spec, int begin = 0, int end = -1);

}  // namespace cleave
