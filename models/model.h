// A trainable model behind a LibTorch-free interface. Every model is a list of stages
// (top-level children run in order) so that split learning can cut it.
//
// Built-in models (all for 1x28x28 inputs, 10 classes):
//   mlp     784-200-200-10 with ReLU (McMahan et al.'s 2NN)
//   lenet5  conv 1->6 5x5, max-pool 2, conv 6->16 5x5, max-pool 2, fc 256->120->84->10, ReLU
//   cnn     conv 1->32 3x3, pool, conv 32->64 3x3, pool, fc 3136->128->10, ReLU
//   vgg     nine stages: conv 1->8, 8->16+pool, 16->32, 32->32+pool, 32->64, 64->64+pool
//           (3x3, padding 1, ReLU), fc 576->256->128->10; for split learning
//   torchscript  a TorchScript archive (e.g. torch.jit.script of an nn.Sequential)
//
// Not thread-safe: one Model per thread. LibTorch exceptions never escape: every call
// returns a Status.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "core/parameter_set.h"
#include "core/status.h"
#include "data/dataset.h"

namespace cleave {

struct ModelSpec {
  std::string name;         // mlp | lenet5 | cnn | vgg | torchscript
  std::string torchscript;  // the archive's bytes, for name == "torchscript"
  uint64_t seed = 0;        // initialisation seed for built-in models
};

struct LocalTrainOptions {
  int epochs = 1;
  int batch_size = 64;
  double lr = 0.05;
  double momentum = 0.0;
  double weight_decay = 0.0;
  double proximal_mu = 0.0;  // FedProx: adds mu/2 * ||w - w_start||^2 to the loss
  uint64_t seed = 0;         // batch order
  // Checked before every batch: once it reads true, Train returns CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};

struct TrainStats {
  double loss = 0;           // mean loss over the last epoch
  int64_t examples = 0;      // examples per epoch
  double seconds = 0;
};

struct EvalStats {
  double accuracy = 0;
  double loss = 0;
  int64_t examples = 0;
};

class Model {
 public:
  // Builds the model. INVALID_ARGUMENT for an unknown name or an unloadable archive.
  static StatusOr<std::unique_ptr<Model>> Create(const ModelSpec& spec);
  ~Model();

  // Trainable parameters in a stable order (the order of named_parameters()).
  ParameterSet Parameters() const;
  // Copies `params` in. INVALID_ARGUMENT unless the layout equals Parameters()'s.
  Status SetParameters(const ParameterSet& params);

  // Trains with SGD on `data` (cross-entropy loss).
  StatusOr<TrainStats> Train(const Dataset& data, const LocalTrainOptions& options);
  // Accuracy and mean cross-entropy on `data`.
  StatusOr<EvalStats> Evaluate(const Dataset& data, int batch_size) const;

  int num_stages() const;

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Sets LibTorch's intra-op thread count for this process.
void SetTorchThreads(int threads);

}  // namespace cleave
