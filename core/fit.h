// FitSettings: what a device trains with in one task, as one type from the job config to
// the optimizer step. The job's train section (TrainConfig, below) gives the run's
// settings (FitOf); a Strategy decides each round's (RoundPlan, with the scheduled
// learning rate); the task carries them on the wire (proto/train_config.h converts
// both ways, field for field); the trainer takes them as LocalTrainOptions
// (models/model.h), which adds only the batch seed and a cancel flag.
#pragma once

#include <cstdint>
#include <string>

#include "core/config_section.h"
#include "core/names.h"

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
  // Activation checkpointing: each decoder block keeps only its input for the backward
  // pass and runs its forward pass again there (hf models).
  bool recompute = false;
};


// The train section of a job config: the run's training settings and the schedule of
// its learning rate. core's own section because every layer shares it: strategies
// schedule it, the wire carries it, the trainer steps with it. Its loss and optimizer
// are names in the models' registries (models/names.h), which the job layer checks.
struct TrainConfig {
  int local_epochs = 1;          // train.local_epochs
  int64_t local_steps = 0;       // train.local_steps: batches per task instead of epochs (0 = off)
  int batch_size = 64;           // train.batch_size
  // train.loss: a Losses() name (models/losses.h): cross_entropy | bce | mse | mae |
  // torchscript (loss_path)
  std::string loss = "cross_entropy";
  std::string loss_path;  // train.loss_path: the TorchScript loss's archive
  std::string optimizer = "sgd"; // train.optimizer: an Optimizers() name: sgd | adam | adamw
  double lr = 0.05;              // train.lr (the schedule's starting rate)
  double momentum = 0.9;         // train.momentum (sgd)
  bool nesterov = false;         // train.nesterov (sgd with momentum)
  double weight_decay = 0.0;     // train.weight_decay (adamw: decoupled)
  double clip_norm = 0;          // train.clip_norm: the gradient's global L2 norm bound (0 = off)
  double label_smoothing = 0;    // train.label_smoothing
  // train.recompute: activation checkpointing per decoder block (hf): each block keeps
  // only its input and is run again in the backward pass; less memory, one more forward
  bool recompute = false;
  // The learning rate of each round (ScheduledLr): warm-up, then the schedule.
  std::string schedule = "constant";  // train.schedule: constant | step | cosine
  int warmup_rounds = 0;         // train.warmup_rounds: linear warm-up from lr / W
  int step_rounds = 10;          // train.step_rounds: step: multiply by step_gamma this often
  double step_gamma = 0.1;       // train.step_gamma
  double lr_min = 0;             // train.lr_min: cosine's final rate
};

// Whether `f` can be trained with: a batch of at least one example (and at most 2^20),
// at least one epoch or step, and rates, momentum, decay, clipping, smoothing and mu that
// are finite and in range. INVALID_ARGUMENT naming `where` (who chose them: a task from
// the server, a strategy's configure_fit) and the field otherwise. The job's train
// section is checked stricter (CheckTrain); these are the values a device may be sent.
Status CheckFit(const FitSettings& f, const std::string& where);

// The run's training settings (train.*, train.lr unscheduled; FedProx's mu is the
// strategy's and stays 0 here).
FitSettings FitOf(const TrainConfig& t);

// The learning rate clients train with in `round` (1-based) of a run of `rounds`.
// Warm-up: lr * r / W for the first W rounds (torch.optim.lr_scheduler.LinearLR from
// 1/W); then, counting rounds from the end of the warm-up (k = 0, 1, ...): constant lr;
// step: lr * gamma^(k / step_rounds) (StepLR); cosine: lr_min + (lr - lr_min)(1 +
// cos(pi k / K)) / 2 over the K = rounds - W remaining rounds (CosineAnnealingLR).
double ScheduledLr(const TrainConfig& t, int64_t round, int64_t rounds);
// The schedules ScheduledLr knows.
const NameTable& ScheduleNames();

// The section (core/config_section.h). CheckTrain checks ranges and the schedule.
void ReadTrain(ConfigSection& s, TrainConfig& c);
Status CheckTrain(TrainConfig& c);

}  // namespace cleave
