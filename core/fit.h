// FitSettings: what a device trains with in one task, as one type from the job config to
// the optimizer step. The job's train section gives the run's settings (FitOf,
// core/config.h); a Strategy decides each round's (RoundPlan, with the scheduled
// learning rate); the task carries them on the wire (proto/train_config.h converts
// both ways, field for field); the trainer takes them as LocalTrainOptions
// (models/model.h), which adds only the batch seed and a cancel flag.
#pragma once

#include <cstdint>
#include <string>

namespace cleave {

struct FitSettings {
  int local_epochs = 1;
  int64_t local_steps = 0;  // > 0: exactly this many batches instead of local_epochs
  int batch_size = 64;
  std::string loss = "cross_entropy";  // one of LossNames() (models/names.h)
  // sgd (momentum, nesterov, weight decay as torch.optim.SGD), adam (torch.optim.Adam:
  // L2 weight decay added to the gradient) or adamw (decoupled weight decay); Adam's
  // betas (0.9, 0.999) and eps 1e-8. Optimizer state starts afresh with every task.
  std::string optimizer = "sgd";
  double lr = 0.05;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  double clip_norm = 0.0;        // > 0: clip the gradient's global L2 norm to this
  double label_smoothing = 0.0;  // cross-entropy's label smoothing, in [0, 1)
  double proximal_mu = 0.0;      // FedProx: adds mu/2 * ||w - w_start||^2 to the loss
};

}  // namespace cleave
