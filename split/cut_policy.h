// Where to cut a client's model: a cost model of one split-training step, and policies
// that choose a cut from it. No LibTorch here: profiles come in as numbers.
//
// A step is one micro-batch. With the client holding stages [0, cut) (and, U-shaped,
// [tail_begin, n)) and the server the rest, one step costs
//   client  = sum of the client's stage times (forward + backward)
//   up      = activations (+ labels, or U-shaped the tail's input gradient) / uplink
//   server  = sum of the server's stage times x server_load (clients per server worker)
//   down    = activation gradients (U-shaped: + the server's output) / downlink
// and takes client + up + server + down + round trips with a window of 1. With W
// micro-batches in flight the resources overlap: the step takes the slowest of them,
// or the whole chain divided by W, whichever is larger.
// A cut is feasible when the client's memory fits its limit and a micro-batch of
// activations fits the largest tensor the server takes. The client's memory is its
// stages' parameters, plus for the trainable ones (all but LoRA's frozen base) a
// gradient, the optimizer's state (none for SGD, momentum, Adam's two moments) and W - 1
// stashed copies, plus for each of W micro-batches in flight its input and what each
// stage's forward pass keeps for the backward pass (measured: for a transformer block the
// attention probabilities, heads x tokens^2 a sequence, the keys and values of its
// key/value heads, fewer with grouped-query attention, and the MLP's hidden activations,
// so sequence length and attention memory count).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace cleave {

struct FitSettings;   // core/fit.h
struct ModelSpec;     // models/model.h
struct StageProfile;  // models/part.h
struct TrainConfig;   // core/fit.h

struct CutProblem {
  std::vector<double> client_stage_s;  // per stage: forward + backward of one batch, client
  std::vector<double> server_stage_s;  // per stage: the same on the server
  std::vector<int64_t> input_bytes;    // the model's input, per sample
  std::vector<int64_t> out_bytes;      // per stage: output bytes per sample on the wire
                                       //   (after compression)
  std::vector<int64_t> param_bytes;    // per stage
  std::vector<int64_t> trainable_bytes;  // per stage, of param_bytes; empty = all train
  std::vector<int64_t> saved_bytes;    // per stage, per sample: kept from forward to
                                       //   backward, output included; empty = out_bytes
  int optimizer_slots = 1;             // state values per trainable value (0 sgd, 1
                                       //   momentum, 2 adam/adamw)
  int batch = 64;
  int window = 1;
  double server_load = 1;              // >= 1: how many clients share a server worker
  double up_bps = 0;                   // bytes/s; 0 = unknown (treated as free)
  double down_bps = 0;
  double rtt_s = 0;
  int64_t memory_limit_bytes = 0;      // 0 = no limit
  int64_t max_message_bytes = 4 << 20;
  int tail_begin = -1;                 // U-shaped: first stage of the client's tail; -1 = none
  double activation_bytes_factor = 1;  // encoded / float32 size of activations on the wire
  double gradient_bytes_factor = 1;    // the same for activation gradients
  // The privacy floor (split.max_reconstruction_ssim): per cut (indexed by cut), the
  // reconstruction SSIM the server's own attack reached there (split/leakage.h), -1 or
  // absent = not measured; a cut measured above max_leakage (> 0) does not fit.
  std::vector<double> leakage;
  double max_leakage = 0;
  std::string leakage_key = "split.max_reconstruction_ssim";  // the floor's key, for messages

  int num_stages() const { return static_cast<int>(client_stage_s.size()); }
};

struct CutPrediction {
  int cut = 0;
  double client_s = 0, up_s = 0, server_s = 0, down_s = 0;
  double step_s = 0;
  int64_t client_memory_bytes = 0;
  int64_t message_bytes = 0;  // largest message of a step
  double leakage = -1;        // CutProblem::leakage at this cut (-1: not measured)
  bool fits = true;           // memory, message size and the privacy floor allow this cut
  std::string why_not;        // when !fits
};

// The cost model above for one cut (1 <= cut < server end).
CutPrediction PredictStep(const CutProblem& p, int cut);
// The memory term of the model above for a device holding stages [begin, end) with
// `window` micro-batches in flight (the model's input counted when begin is 0).
// [0, num_stages()) is training the whole model on one device.
int64_t StagesMemoryBytes(const CutProblem& p, int begin, int end, int window = 1);

// The model's side of a problem, from the server's profile of every stage (ProfileStages
// on a batch of train.batch_size samples shaped `sample_shape`): server stage times,
// parameter, trainable and kept bytes, the bytes crossing each cut, the optimizer's
// state slots (train.optimizer, train.momentum), batch and window. The client's side
// (its stage times, link, memory limit) and the server's load come later.
CutProblem ModelCutProblem(const std::vector<StageProfile>& stages,
                           const std::vector<int64_t>& sample_shape, const TrainConfig& train,
                           int window);

// Training the whole of `spec` on one device, batches of fit.batch_size samples shaped
// `sample_shape`: the memory it takes (parameters, gradients, optimizer state,
// activations: StagesMemoryBytes of every stage, plus the frozen parameters; what a
// client checks its --memory-limit-mb against) and the seconds of one batch's forward
// and backward here (`reps` timed).
struct TrainingCost {
  int64_t memory_bytes = 0;
  double seconds = 0;
};
StatusOr<TrainingCost> WholeModelCost(const ModelSpec& spec, const std::vector<int64_t>& sample_shape,
                                      const FitSettings& fit, int reps);

class CutPolicy {
 public:
  virtual ~CutPolicy() = default;
  virtual std::string name() const = 0;
  // FAILED_PRECONDITION when no cut is feasible.
  virtual StatusOr<CutPrediction> Choose(const CutProblem& p) = 0;
};

// The cut with the least predicted step time among the feasible ones (ties: the
// shallower cut, which keeps less on the device).
std::unique_ptr<CutPolicy> MakeCostModelPolicy();
// Always `cut` (a fixed split.cut); FAILED_PRECONDITION if it does not fit.
std::unique_ptr<CutPolicy> MakeFixedPolicy(int cut);

// Corrections learned from measured steps: each component's measured / predicted ratio,
// smoothed exponentially. Applied to a problem before choosing again.
struct CutFeedback {
  double client_scale = 1, transfer_scale = 1, server_scale = 1;
  int observations = 0;

  void Observe(const CutPrediction& predicted, double client_s, double transfer_s,
               double server_s, double smoothing = 0.5);
  CutProblem Apply(CutProblem p) const;
};

}  // namespace cleave
