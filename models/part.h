// A part of a cut model: the stages [begin, end) of a staged model, trained one
// micro-batch at a time. Split learning runs one part on the client and another on the
// server; what crosses the cut is a batch of activations one way and their gradients
// the other.
//
// Parameters keep the names they have in the whole model ("3.0.weight"), so parts of
// the same model are subsets of one ParameterSet and average stage by stage.
//
// Training: Forward(id) keeps the autograd graph of micro-batch `id` until Backward(id)
// supplies the gradient of the part's output, back-propagates, and takes one step of
// the job's optimizer (SGD, Adam or AdamW as torch.optim). Several micro-batches may be
// pending at once (a window). A step taken while others are pending first saves the weights
// their forward passes used, and their backward passes run through those (weight
// stashing, as in PipeDream): each gradient is the exact gradient at the weights that
// produced the activations, applied to the live weights one or more steps later.
// Without stashing, momentum SGD diverges in pipelined U-shaped training.
// TrainWithLoss is the last part's whole step: forward, cross-entropy, backward, step.
// Optimizer state (momentum, Adam's moments and step count) is kept per tensor, so a
// tensor's first update is its first step even when micro-batches start at later
// stages.
//
// Not thread-safe: one caller at a time. LibTorch exceptions never escape.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/parameter_set.h"
#include "core/status.h"
#include "data/dataset.h"
#include "models/model.h"

namespace cleave {

// A batch of activations or activation gradients: float32, shape [batch, ...].
struct Activations {
  std::vector<int64_t> shape;
  std::vector<float> values;

  int64_t batch() const { return shape.empty() ? 0 : shape[0]; }
};


// The examples `indices` of `data` as the input of a model's first stage (normalised;
// text: each sequence's token ids but the last, as floats).
// Text: `length` > 0 reads only each sequence's first `length` tokens (a causal model's
// outputs there are the same).
Activations InputBatch(const Dataset& data, const std::vector<int64_t>& indices, int64_t length = 0);

// What the examples `indices` of `data` are trained to predict, in order: their labels;
// text: each sequence's next tokens (length - 1 per sequence; `length` > 0: the first
// `length` of them, the targets of InputBatch's tokens).
std::vector<int64_t> BatchLabels(const Dataset& data, const std::vector<int64_t>& indices, int64_t length = 0);

class ModelPart {
 public:
  // The stages [begin, end) of the model `spec`, 0 <= begin < end <= number of stages.
  static StatusOr<std::unique_ptr<ModelPart>> Create(const ModelSpec& spec, int begin, int end);
  ~ModelPart();

  int begin() const;
  int end() const;

  // This part's parameters (whole-model names, model order).
  ParameterSet Parameters() const;
  // Their names alone.
  std::vector<std::string> TensorNames() const;
  // Copies in this part's tensors, looked up by name in `params` (the whole model or
  // just this part). INVALID_ARGUMENT when one is missing (unless `partial`: then only
  // those present are copied) or has another shape.
  Status LoadFrom(const ParameterSet& params, bool partial = false);
  // The same from an encoded parameter set's views (ParseParameterSet), copied straight
  // from the encoding into the part's tensors.
  Status LoadFrom(const std::vector<TensorView>& views, bool partial = false);
  // A frozen base's tensors (LoRA's, Task.base_digest), looked up by name (partial): a
  // frozen one (not trained) uses `base`'s values in place, with no copy; a trainable one
  // is copied. `base` must outlive the part and not change while it lives; the part
  // never writes a frozen tensor. INVALID_ARGUMENT for a tensor of another shape.
  Status LoadBase(const ParameterSet& base);
  // A device with the model's Hugging Face folder (model hf): this part's tensors, all
  // but its LoRA adapters, read from DIR straight into the part's own memory
  // (LoadHfInto: only the shards that hold them, nothing whole beside the part). Not
  // after LoadBase. Errors name the file and the tensor; the part may then be partly
  // loaded.
  Status LoadHfFolder(const std::string& dir);
  // Views of its frozen tensors (those training leaves alone: a LoRA part's base), in
  // the part's order; valid while the part lives and they are not loaded again.
  std::vector<TensorView> FrozenViews() const;
  // A quantized base (ModelSpec::quantize): this part's quantized weights, and their
  // replacement by `set`'s (shared, not copied), as Model's.
  QuantizedSet QuantizedBase() const;
  Status LoadQuantized(const QuantizedSet& set);
  // Sets how the part steps, from whole-model training's options: optimizer, lr,
  // momentum, nesterov, weight_decay, clip_norm (the norm of this part's own gradient:
  // neither side of a cut sees the other's) and label_smoothing (TrainWithLoss's); the
  // rest do not apply to a part. Clears the optimizer state and any pending micro-batch.
  // INVALID_ARGUMENT for an unknown optimizer.
  Status ResetOptimizer(const LocalTrainOptions& training);
  // NoPeek (Vepakomma et al. 2020): Backward of a micro-batch that started at stage 0
  // also minimises alpha · dCor(input, output), the distance correlation between the
  // raw input and the activations sent across the cut (under SetAccumulate(M), the mean
  // of the micro-batches' terms: alpha / M each). 0 = off.
  void SetNoPeek(double alpha);

  // Runs stages [from, end()) on `in` (from < 0: begin()) and keeps what Backward(id)
  // needs. Starting later than begin() lets clients cut at different stages share one
  // server part; only the stages that ran are stepped.
  StatusOr<Activations> Forward(int64_t id, const Activations& in, int from = -1);
  // Back-propagates `grad_out` (the gradient of the loss with respect to Forward(id)'s
  // output), takes one optimizer step and returns the gradient with respect to the input
  // (empty when the micro-batch started at stage 0). NOT_FOUND for an unknown id.
  StatusOr<Activations> Backward(int64_t id, const Activations& grad_out);
  // SplitGuard (privacy/split_guard.h): Backward that also returns the gradient of the part's
  // first trainable tensor for this micro-batch alone (flattened), and with `step` false
  // drops every gradient of it instead of stepping: a probe batch leaves the weights as
  // they were. Not under SetAccumulate (FAILED_PRECONDITION).
  struct Probe {
    Activations grad_in;
    std::vector<float> first_gradient;
  };
  StatusOr<Probe> BackwardProbe(int64_t id, const Activations& grad_out, bool step);

  struct LossStep {
    double loss = 0;       // mean cross-entropy of the micro-batch (label-smoothed if set)
    int64_t correct = 0;   // correct top-1 predictions (per token for a language model)
    Activations grad_in;   // empty for a part that starts at stage 0
  };
  // Forward from stage `from` (as Forward), mean cross-entropy against `labels` (one
  // per sample; for outputs [B, T, classes], one per token, B * T), backward, optimizer
  // step.
  // Under SetAccumulate, `share` > 0 is the micro-batch's share of the batch's loss (it
  // back-propagates loss x share; 0: 1 / micro_batches). FAILED_PRECONDITION, and no
  // step, when the loss (or, stepping, the input's gradient) is not finite.
  StatusOr<LossStep> TrainWithLoss(const Activations& in, const std::vector<int64_t>& labels,
                                   int from = -1, double share = 0);

  // Pipelines (issue 38): with `micro_batches` > 0, Backward and TrainWithLoss take no
  // optimizer step: gradients add up over micro-batches (TrainWithLoss back-propagates
  // its loss divided by `micro_batches`, so that a batch of that many equal micro-batches
  // gets the gradient of its mean loss) until Step. 0 (the default) steps after each.
  void SetAccumulate(int micro_batches);
  // One optimizer step with the gradients added up since the last (clip_norm applied to
  // their sum), then zeroes them. FAILED_PRECONDITION while a micro-batch is pending.
  Status Step();

  size_t pending() const;
  // Values of optimizer state held (momentum, Adam's moments): trainable tensors only.
  int64_t OptimizerStateElements() const;

 private:
  struct Impl;
  explicit ModelPart(std::unique_ptr<Impl> impl);
  StatusOr<Probe> BackwardPass(int64_t id, const Activations& grad_out, bool probe, bool step);
  std::unique_ptr<Impl> impl_;
};

// The sample distance correlation of two batches (rows = samples), in [0, 1].
StatusOr<double> DistanceCorrelation(const Activations& x, const Activations& z);

// The stage each of the model's parameter tensors belongs to, in model order.
StatusOr<std::vector<int>> ParameterStages(const ModelSpec& spec);

// What a stage costs on this machine.
struct StageProfile {
  double seconds = 0;              // forward + backward of one batch
  int64_t out_elements = 0;        // output elements per sample (what crosses a cut after it)
  int64_t param_elements = 0;      // parameters, frozen ones included
  int64_t trainable_elements = 0;  // those that train (all but LoRA's frozen base)
  int64_t quantized_bytes = 0;     // a quantized base's weights (not parameters), encoded
  // Tensor bytes per sample that the forward pass leaves allocated until its backward
  // pass: the output and everything autograd saved (a transformer block's attention
  // probabilities, heads x tokens^2, its MLP's hidden activations), measured.
  int64_t saved_bytes = 0;
  std::vector<int64_t> out_shape;  // output shape of one sample
};

// Times every stage of `spec` (forward and backward, median of `reps` after a warm-up)
// on a random batch of `batch` samples shaped `sample_shape` (e.g. {1, 28, 28}), and
// measures what its forward pass keeps for the backward pass (the bytes of tensors the
// calling thread allocates, whatever other threads do),
// with activation checkpointing when `recompute` (train.recompute).
StatusOr<std::vector<StageProfile>> ProfileStages(const ModelSpec& spec,
                                                  const std::vector<int64_t>& sample_shape,
                                                  int batch, int reps, bool recompute = false);

}  // namespace cleave
