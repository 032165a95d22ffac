// The built-in model architectures, by model.name, in a registry: mlp (any input),
// lenet5, cnn, vgg, resnet (images [C, H, W]) and gpt (text, sized by ModelSpec::gpt).
// model.name: torchscript (an archive of one's own) is not among them.
//
// A built-in model is a staged torch::nn::Sequential: each element is one stage, the
// places split learning may cut between. Adding an architecture is one build function
// in its own file and one registration, of how it is built and what it is:
//
//   ModelTraits images;
//   images.input = ModelInput::kImages;
//   AddModel("mynet", {BuildMyNet}, images);
//
// What the rest of the code may ask of a kind (reads tokens, scales, ...) it asks
// through models/kinds.h (LibTorch-free), which holds the built-in kinds' traits.
//
// Build functions draw their initial weights from torch's generator, which
// BuildBuiltin seeds with ModelSpec::seed.
#pragma once

#include <string>
#include <vector>

#include "core/registry.h"
#include "models/kinds.h"
#include "models/model.h"

namespace torch {
namespace nn {
class Sequential;
}  // namespace nn
}  // namespace torch

namespace cleave {

// How a kind is built; what it is, its ModelTraits, is registered beside it.
struct ModelKind {
  torch::nn::Sequential (*build)(const ModelSpec& spec) = nullptr;
  // The spec's own checks before build (a decoder's size, its LoRA targets); null: none.
  Status (*check)(const ModelSpec& spec) = nullptr;
  // Builds only the stages [begin, end) (end < 0: to the last), the others empty
  // placeholders, for a part of a model too large to build whole; null: build does.
  torch::nn::Sequential (*build_stages)(const ModelSpec& spec, int begin, int end) = nullptr;
};

// The built-in architectures by model.name (every ModelKinds() entry but torchscript).
Registry<ModelKind>& Models();

// Registers model kind `name`: its builder in Models(), its traits in ModelKinds().
// ALREADY_EXISTS (and neither changed) when either holds the name.
Status AddModel(const std::string& name, ModelKind kind, ModelTraits traits);

// The built-in model `spec` names, seeded with spec.seed: INVALID_ARGUMENT for an
// unknown name or an input it cannot take. With a stage range, a model that can builds
// only those stages (ModelKind::build_stages): their initial values may then differ from
// the whole model's. For LibTorch translation units.
StatusOr<torch::nn::Sequential> BuildBuiltin(const ModelSpec& spec, int begin = 0, int end = -1);

}  // namespace cleave
