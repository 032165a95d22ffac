// FitSettings (core/fit.h) on the wire: a task's TrainConfig, field for field. The only
// conversion between the two; the seed and the TorchScript loss's blob are the task's
// own and are set by the caller.
#pragma once

#include "cleave/v1/cleave.pb.h"
#include "core/fit.h"

namespace cleave {

inline void ToProto(const FitSettings& f, v1::TrainConfig* t) {
  t->set_local_epochs(f.local_epochs);
  t->set_local_steps(f.local_steps);
  t->set_batch_size(f.batch_size);
  t->set_loss(f.loss);
  t->set_optimizer(f.optimizer);
  t->set_lr(f.lr);
  t->set_momentum(f.momentum);
  t->set_nesterov(f.nesterov);
  t->set_weight_decay(f.weight_decay);
  t->set_clip_norm(f.clip_norm);
  t->set_label_smoothing(f.label_smoothing);
  t->set_proximal_mu(f.proximal_mu);
  t->set_recompute(f.recompute);
}

// Empty loss and optimizer mean the defaults (cross_entropy, sgd), as older servers
// sent them.
inline FitSettings FitFromProto(const v1::TrainConfig& t) {
  FitSettings f;
  f.local_epochs = t.local_epochs();
  f.local_steps = t.local_steps();
  f.batch_size = t.batch_size();
  if (!t.loss().empty()) f.loss = t.loss();
  if (!t.optimizer().empty()) f.optimizer = t.optimizer();
  f.lr = t.lr();
  f.momentum = t.momentum();
  f.nesterov = t.nesterov();
  f.weight_decay = t.weight_decay();
  f.clip_norm = t.clip_norm();
  f.label_smoothing = t.label_smoothing();
  f.proximal_mu = t.proximal_mu();
  f.recompute = t.recompute();
  return f;
}

}  // namespace cleave
