// SplitGuard (Erdogan, Küpçü and Çiçek 2022, "SplitGuard: Detecting and mitigating
// training-hijacking attacks in split learning"): a device's check that the server trains
// the task it says, from the gradients it sends back (cleave-client --split-guard).
//
// Now and then the device sends a fake micro-batch: some of its labels moved to another
// class. An honest server's gradient then pulls the client part somewhere else than on
// the device's regular micro-batches; a server that ignores the labels (feature-space
// hijacking, Pasquini et al. 2021: it trains the client part to feed its own decoder)
// sends gradients that look the same either way. The device keeps the gradient of its
// part's first trainable tensor for every micro-batch after a warm-up, steps on the
// regular ones only, and scores the fakes F against the regulars R, next to controls C:
// regular micro-batches drawn at the fakes' rate, so as few and as noisy as they are.
//
//   d = |‖F‖ - ‖R‖| + |‖C‖ - ‖R‖|         ‖X‖: the mean norm of X's gradients
//   x = θ(F̄, R̄) |‖F‖ - ‖R‖| / d - θ(C̄, R̄) |‖C‖ - ‖R‖| / d
//   score = sigmoid(mult · x) ^ exp        θ: the angle between mean gradients, radians
//
// This is the paper's score with its mult 5 and exp 2, except that the paper compares
// the fakes' gap with the gap between two random halves of the regulars. Each half holds
// about ten times as many gradients as the fakes, so its mean wanders about three times
// less, and noisy gradients that ignore the labels scored around the paper's threshold
// (a hijack was missed once in CI; tests/split/hijack_test.cc). With controls, such a
// server's F and C are alike: x is as often below 0 as above, and the score centres on
// sigmoid(0)^2 = 0.25. Honest training scores near 1.
// The guard refuses the server once the mean of its last min_fakes scores falls under
// the threshold. Unlike the paper, old evidence fades (`memory`): a server that trains
// honestly for a while and then hijacks is judged on its recent gradients.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"

namespace cleave {

struct SplitGuardOptions {
  bool enabled = false;
  // The chance that a micro-batch after the warm-up is a fake, and the share of a fake's
  // labels moved (the paper's b_fake / batch). The paper's 0.1 and 1 cost an honest
  // federation trained with plain SGD a great deal: the honest server steps on every fake
  // (docs/benchmarks.md, "A malicious server and the device's guard").
  double fake_rate = 0.05;
  double fake_share = 0.5;
  int warmup = 20;          // micro-batches (over the device's tasks) before the guard starts
  int min_fakes = 10;       // fakes scored (once controls and regulars have one) before it may refuse
  double threshold = 0.6;   // the mean of the last min_fakes scores under which it refuses
                            // (between a hijack's 0.25 and an honest server's 1)
  // How long evidence counts, in micro-batches: every gradient set forgets by a factor
  // (1 - 1/memory) a micro-batch, so a server that hijacks after training honestly is
  // judged on what it does now. 0: everything since the start counts (the paper's).
  int memory = 100;
  double mult = 5, exp = 2; // the score's squashing
  uint64_t seed = 0;        // 0: from the OS (a device's); tests fix it
};

// The mean gradient and mean norm of a set of gradients, as they come, each weighed by
// how recent it is (Decay). The sums hold each gradient divided by `scale` at its
// arrival, so that Decay costs nothing: the means are ratios in which scale cancels.
struct GradientSet {
  std::vector<double> sum;
  double norm_sum = 0;
  double weight = 0;  // of the gradients in the sums
  double scale = 1;   // what the sums are worth now, per unit
  int64_t n = 0;      // gradients added
  void Add(const std::vector<float>& g);
  // Older gradients count `factor` times less than they did.
  void Decay(double factor);
  double mean_norm() const { return weight > 0 ? norm_sum / weight : 0; }
};

// The score of fakes F against regulars R, with controls C (above); 1 (no evidence) when
// the norms give no difference (d = 0) or a set is empty.
double SplitGuardScore(const GradientSet& fakes, const GradientSet& controls, const GradientSet& regulars,
                       double mult = 5, double exp = 2);

// Whether `s` is a guard's refusal (SplitGuard::Add's PERMISSION_DENIED), not another
// error of the same code.
bool IsSplitGuardVerdict(const Status& s);

// A device's guard over its split tasks (their evidence adds up). Its randomness comes from the OS: the server must not be able to
// tell a fake from a regular micro-batch.
class SplitGuard {
 public:
  explicit SplitGuard(const SplitGuardOptions& options);
  // Whether the next micro-batch goes out as a fake.
  bool NextIsFake();
  // `labels` moved by one random offset in [1, classes) modulo `classes`, each with
  // probability fake_share; labels outside [0, classes) (a language model's positions
  // without a target) stay.
  void Fake(int64_t classes, std::vector<int64_t>* labels);
  // The first-tensor gradient of a micro-batch that came back. After a fake,
  // PERMISSION_DENIED (saying the score) once the mean of the last min_fakes scores is
  // under the threshold.
  Status Add(bool fake, const std::vector<float>& gradient);
  int64_t fakes() const { return fakes_.n; }
  // The mean of the last min_fakes scores (1 before any), and how many it averages.
  double mean_score() const;
  int scores() const { return static_cast<int>(scores_.size()); }

 private:
  SplitGuardOptions o_;
  std::mt19937_64 rng_;
  int64_t seen_ = 0;  // micro-batches handed out
  GradientSet fakes_, controls_, regulars_;
  std::deque<double> scores_;  // the last min_fakes
};

}  // namespace cleave
