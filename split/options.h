// The split section of a job config (core/config_section.h; the job layer registers
// it, job/job.cc). docs/split-learning.md describes the modes.
#pragma once

#include <string>

#include "core/config_section.h"
#include "split/names.h"

namespace cleave {

struct SplitConfig {
  std::string mode;              // split.mode: "" (federated, the default) | sl | sfl-v1 |
                                 //   sfl-v2 | ushaped (SplitModeNames(), split/names.h)
  static constexpr int kAutoCut = 0;
  int cut = kAutoCut;            // split.cut: "auto" (kAutoCut) or the first server stage
  int tail = 1;                  // split.tail: ushaped (and pipeline with split.ushaped):
                                 //   last stages kept by the client
  int window = 1;                // split.window: micro-batches in flight per client
  double activation_noise = 0;   // split.activation_noise: std of Gaussian noise the client
                                 //   adds to the activations it sends (0 = none)
  double nopeek = 0;             // split.nopeek: NoPeek's distance-correlation weight alpha
  double label_epsilon = 0;      // split.label_epsilon: > 0, label DP by randomized response
                                 //   (each label the device uses is epsilon-RR'd); 0 = off
  // pipeline: devices per chain, micro-batches per batch, and their order on each holder.
  int devices = 2;               // split.devices
  int micro_batches = 4;         // split.micro_batches: divides train.batch_size
  int micro_batch_tokens = 0;    // split.micro_batch_tokens: > 0 (text): micro-batches by
                                 //   this token budget instead (sequence-length balancing)
  std::string schedule = "1f1b"; // split.schedule: gpipe | 1f1b
  std::string plan = "auto";     // split.plan: auto (the planner) | even (a fixed cut's
                                 //   stages shared out evenly, devices in order)
  bool ushaped = false;          // split.ushaped: the chain's data owner also keeps the
                                 //   last split.tail stages (the head, the loss, the labels)
  // split.max_reconstruction_ssim: > 0, the automatic cut's privacy floor: only cuts
  // where the server's own reconstruction attack on its test images stays at or under
  // this SSIM (split/leakage.h); 0 = none
  double max_reconstruction_ssim = 0;
  // split.max_token_recovery: its counterpart for a decoder: only cuts where the
  // server's own token inversion on its test text recovers at most this share; 0 = none
  double max_token_recovery = 0;
  int record = 0;                // split.record: the server keeps each split task's first
                                 //   this many micro-batches as received (privacy/attacks)
  // split.hijack: "" (an honest server) | fsha: red team, the server attacks its own
  // devices by feature-space hijacking (FeatureSpaceHijack, models/inversion.h) to
  // measure their guard (cleave-client --split-guard); it trains no model
  std::string hijack;

  bool enabled() const { return !mode.empty(); }
  // Whether split.mode is `m` (never without split learning).
  bool Is(SplitMode m) const { return mode == SplitModeName(m); }
  bool auto_cut() const { return cut == kAutoCut; }
  // The client keeps the head: mode ushaped, or a U-shaped pipeline.
  bool keeps_head() const { return Is(SplitMode::kUShaped) || (Is(SplitMode::kPipeline) && ushaped); }
};

void ReadSplit(ConfigSection& s, SplitConfig& c);
// Checks split.mode against SplitModeNames().
Status CheckSplit(SplitConfig& c);

}  // namespace cleave
