#include "core/fit.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace cleave {

const NameTable& ScheduleNames() {
  static const NameTable t{"train.schedule", {"constant", "step", "cosine"}};
  return t;
}

void ReadTrain(ConfigSection& s, TrainConfig& c) {
  s.Read("local_epochs", c.local_epochs);
  s.Read("local_steps", c.local_steps);
  s.Read("batch_size", c.batch_size);
  s.Read("loss", c.loss);
  s.ReadPath("loss_path", c.loss_path);
  s.Read("optimizer", c.optimizer);
  s.Read("lr", c.lr);
  s.Read("momentum", c.momentum);
  s.Read("nesterov", c.nesterov);
  s.Read("weight_decay", c.weight_decay);
  s.Read("clip_norm", c.clip_norm);
  s.Read("label_smoothing", c.label_smoothing);
  s.Read("recompute", c.recompute);
  s.Read("schedule", c.schedule);
  s.Read("warmup_rounds", c.warmup_rounds);
  s.Read("step_rounds", c.step_rounds);
  s.Read("step_gamma", c.step_gamma);
  s.Read("lr_min", c.lr_min);
}

Status CheckTrain(TrainConfig& t) {
  RETURN_IF_ERROR(Range(t.local_epochs >= 1, "train.local_epochs", ">= 1"));
  RETURN_IF_ERROR(Range(t.batch_size >= 1, "train.batch_size", ">= 1"));
  RETURN_IF_ERROR(Range(t.lr > 0, "train.lr", "> 0"));
  RETURN_IF_ERROR(Range(t.momentum >= 0 && t.momentum < 1, "train.momentum", "in [0, 1)"));
  RETURN_IF_ERROR(Range(t.weight_decay >= 0, "train.weight_decay", ">= 0"));
  RETURN_IF_ERROR(Range(t.local_steps >= 0, "train.local_steps", ">= 0 (0 = use local_epochs)"));
  RETURN_IF_ERROR(Range(t.label_smoothing == 0 || t.loss == "cross_entropy", "train.label_smoothing",
                        "0 unless train.loss is cross_entropy"));
  RETURN_IF_ERROR(Range(!t.nesterov || (t.optimizer == "sgd" && t.momentum > 0), "train.nesterov",
                        "used with optimizer sgd and momentum > 0"));
  RETURN_IF_ERROR(Range(t.clip_norm >= 0, "train.clip_norm", ">= 0 (0 = no clipping)"));
  RETURN_IF_ERROR(Range(t.label_smoothing >= 0 && t.label_smoothing < 1, "train.label_smoothing",
                        "in [0, 1)"));
  RETURN_IF_ERROR(ScheduleNames().Check(t.schedule));
  RETURN_IF_ERROR(Range(t.warmup_rounds >= 0, "train.warmup_rounds", ">= 0"));
  RETURN_IF_ERROR(Range(t.step_rounds >= 1, "train.step_rounds", ">= 1"));
  RETURN_IF_ERROR(Range(t.step_gamma > 0 && t.step_gamma <= 1, "train.step_gamma", "in (0, 1]"));
  return Range(t.lr_min >= 0 && t.lr_min <= t.lr, "train.lr_min", "in [0, train.lr]");
}

Status CheckFit(const FitSettings& f, const std::string& where) {
  auto bad = [&](const char* field, const std::string& rule, const std::string& value) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, " must be ", rule, ", not ", value));
  };
  auto finite = [](double v, double lo) { return std::isfinite(v) && v >= lo; };
  if (f.batch_size < 1 || f.batch_size > (1 << 20)) return bad("batch_size", "in [1, 2^20]", absl::StrCat(f.batch_size));
  if (f.local_steps < 0) return bad("local_steps", ">= 0", absl::StrCat(f.local_steps));
  if (f.local_epochs < 1 && f.local_steps == 0) {
    return bad("local_epochs", ">= 1 (or local_steps > 0)", absl::StrCat(f.local_epochs));
  }
  if (!finite(f.lr, 0)) return bad("lr", "finite and >= 0", absl::StrCat(f.lr));
  if (!finite(f.momentum, 0) || f.momentum >= 1) return bad("momentum", "in [0, 1)", absl::StrCat(f.momentum));
  if (!finite(f.weight_decay, 0)) return bad("weight_decay", "finite and >= 0", absl::StrCat(f.weight_decay));
  if (!finite(f.clip_norm, 0)) return bad("clip_norm", "finite and >= 0", absl::StrCat(f.clip_norm));
  if (!finite(f.label_smoothing, 0) || f.label_smoothing >= 1) {
    return bad("label_smoothing", "in [0, 1)", absl::StrCat(f.label_smoothing));
  }
  if (!finite(f.proximal_mu, 0)) return bad("proximal_mu", "finite and >= 0", absl::StrCat(f.proximal_mu));
  return absl::OkStatus();
}

FitSettings FitOf(const TrainConfig& t) {
  FitSettings f;
  f.local_epochs = t.local_epochs;
  f.local_steps = t.local_steps;
  f.batch_size = t.batch_size;
  f.loss = t.loss;
  f.optimizer = t.optimizer;
  f.lr = t.lr;
  f.momentum = t.momentum;
  f.nesterov = t.nesterov;
  f.weight_decay = t.weight_decay;
  f.clip_norm = t.clip_norm;
  f.label_smoothing = t.label_smoothing;
  f.recompute = t.recompute;
  return f;
}

double ScheduledLr(const TrainConfig& t, int64_t round, int64_t rounds) {
  const int64_t r = round - 1;  // 0-based
  if (r < t.warmup_rounds) return t.lr * static_cast<double>(r + 1) / t.warmup_rounds;
  const int64_t k = r - t.warmup_rounds;
  if (t.schedule == "step") return t.lr * std::pow(t.step_gamma, static_cast<double>(k / t.step_rounds));
  if (t.schedule == "cosine") {
    const int64_t total = std::max<int64_t>(1, rounds - t.warmup_rounds);
    return t.lr_min + (t.lr - t.lr_min) * (1 + std::cos(M_PI * static_cast<double>(k) / total)) / 2;
  }
  return t.lr;
}

}  // namespace cleave
