// A trainable model behind a LibTorch-free interface. Every model is a list of stages
// (top-level children run in order) so that split learning can cut it.
//
// Built-in models, for inputs shaped `ModelSpec::input_shape` ([C, H, W] images or
// [features] tables) and `num_classes` outputs:
//   mlp     flatten, 200, 200, classes with ReLU (McMahan et al.'s 2NN; also for tables)
//   lenet5  conv C->6 5x5, max-pool 2, conv 6->16 5x5, max-pool 2, fc ->120->84->classes
//   cnn     conv C->32 3x3, pool, conv 32->64 3x3, pool, fc ->128->classes, ReLU
//   vgg     nine stages: conv C->8, 8->16+pool, 16->32, 32->32+pool, 32->64, 64->64+pool
//           (3x3, padding 1, ReLU), fc ->256->128->classes; for split learning
//   resnet  a small ResNet for 32x32 RGB (He et al.'s CIFAR ResNet-8): conv C->16 + BN,
//           three basic blocks (16, 32 stride 2, 64 stride 2), global average pool, fc;
//           five stages. BatchNorm's running statistics travel with the parameters.
//   gpt     a GPT-2-style decoder for text (models/gpt.h), sized by ModelSpec::gpt; its
//           stages are the embedding, each block and the head. Token data only.
//   torchscript  a TorchScript archive: any scripted module for whole-model federated
//           learning; its top-level children are the stages for split learning
// A model's tensors are its parameters and its floating-point buffers (BatchNorm's
// running mean and variance), so FedAvg averages the statistics with the weights.
//
// Not thread-safe: one Model per thread. LibTorch exceptions never escape: every call
// returns a Status.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compression/quantized_set.h"
#include "core/fit.h"
#include "core/parameter_set.h"
#include "core/status.h"
#include "data/dataset.h"
#include "models/options.h"

namespace cleave {

struct ModelSpec {
  std::string name;         // mlp | lenet5 | cnn | vgg | resnet | gpt | hf | torchscript
  std::string torchscript;  // the archive's bytes, for name == "torchscript"
  uint64_t seed = 0;        // initialisation seed for built-in models
  std::vector<int64_t> input_shape = {1, 28, 28};  // one example, for built-in models
  int num_classes = 10;                            // outputs, for built-in models
  // For name == "gpt": its size. For "hf": the vocabulary, context, layers, heads,
  // width and tying of hf_config's decoder (SetHfModel, models/hf_folder.h), which the
  // code for token models reads.
  GptConfig gpt{};
  LoraConfig lora{};                               // adapters, for "gpt" and "hf"
  std::string hf_config{};  // config.json's text, for name == "hf" (models/llama.h)
  // The codec of a quantized frozen base (model.quantize; "int8:channel", "nf4",
  // "nf4:dq"): hf's block projections held in it, dequantized inside each matmul and
  // never part of Parameters() (QuantizedBase). "" = float32.
  std::string quantize{};
  // Width-scaled submodels (HeteroFL, FedRolex; section width): every hidden layer keeps
  // ceil(width x) of its x channels or features (at least 1), and a layer whose inputs
  // were cut is followed by a scaler (output / sqrt(width); models/builtin_models.cc says
  // why not HeteroFL's / width). 1 = the whole model. mlp, lenet5 and cnn.
  double width = 1;
  // Static batch normalization (model.batch_norm: static; resnet): no running
  // statistics, each batch normalised by its own in training and evaluation.
  bool static_bn = false;
  // For name == "hf": the weights are read from the folder right after the model is
  // built, so its float32 tensors are not drawn (a large model builds in a moment).
  bool weights_follow = false;
  // For name == "interop": this device's base (mlp, lenet5 or cnn, without its last
  // layer) and the shared block's width (model.interop).
  std::string interop_base{};
  int64_t interop_width = 0;

  // Whether the model reads token ids (gpt, hf: ModelTraits::tokens, models/kinds.h).
  bool text() const;
};

// The examples of Model::Train's first batch on `n` examples with `seed` and `batch`
// (LocalTrainOptions'): the start of its first epoch's order.
std::vector<int64_t> FirstBatchIndices(int64_t n, uint64_t seed, int64_t batch);

// model.name interop: whether tensor `name` is a device's own (its base, stage 0, and
// its fusion layer, stage 1), never sent nor averaged; the shared block is stages 2 and 3.
bool InteropPrivate(const std::string& name);

// The model a job's model section describes, initialised from `seed` (run.seed); for
// torchscript the caller reads model.path into `torchscript`.
ModelSpec ModelSpecOf(const ModelConfig& model, uint64_t seed);

// The built-in model names (without torchscript), for validation and messages.
std::vector<std::string> BuiltinModelNames();

// What Model::Distill does (FedDF's server step; width.distill).
struct DistillOptions {
  int64_t steps = 200;
  double lr = 1e-3;
  int batch_size = 128;
  double temperature = 1;
  uint64_t seed = 0;  // batch order
};

// FitSettings (core/fit.h) plus what only the trainer needs.
struct LocalTrainOptions : FitSettings {
  LocalTrainOptions() = default;
  explicit LocalTrainOptions(const FitSettings& fit, uint64_t seed = 0)
      : FitSettings(fit), seed(seed) {}
  uint64_t seed = 0;  // batch order
  // Checked before every batch: once it reads true, Train returns CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};

// The batches one local training task takes: local_steps when > 0, else `epochs` passes
// over `examples` in batches of batch_size (the last one partial).
inline int64_t TaskSteps(int64_t local_steps, int epochs, int64_t examples, int batch_size) {
  return local_steps > 0 ? local_steps
                         : int64_t{epochs} * ((examples + batch_size - 1) / batch_size);
}

struct TrainStats {
  double loss = 0;           // mean loss over the last epoch
  int64_t examples = 0;      // examples per epoch
  double seconds = 0;
};

struct EvalStats {
  double accuracy = 0;  // classification and binary; text: of the next token
  double loss = 0;      // the mean of the task's loss; text: per predicted token
  int64_t examples = 0;
  // The task's other metrics: classification: top5_accuracy (5 classes or more);
  // binary: precision, recall, f1 (of class 1); regression: mae, rmse; text:
  // perplexity (exp loss), bits_per_byte (loss / ln 2 / Dataset::bytes_per_token),
  // tokens (predicted).
  std::map<std::string, double> metrics;
  std::vector<double> per_class_accuracy;  // classification: per label (NaN: none in data)
};

class Model {
 public:
  // Builds the model. INVALID_ARGUMENT for an unknown name or an unloadable archive.
  static StatusOr<std::unique_ptr<Model>> Create(const ModelSpec& spec);
  ~Model();

  // The model's tensors in a stable order: named_parameters(), then the floating-point
  // named_buffers().
  ParameterSet Parameters() const;
  // Copies `params` in. INVALID_ARGUMENT unless the layout equals Parameters()'s.
  Status SetParameters(const ParameterSet& params);
  // The tensors an update carries: Parameters() less FrozenTensors() (all of them for a
  // model without a frozen base), and their copy in, as SetParameters's; the frozen ones
  // stay as they are.
  ParameterSet TrainedParameters() const;
  Status SetTrainedParameters(const ParameterSet& params);
  // A frozen base (LoRA's, Task.base_digest): exactly FrozenTensors(), by name. The
  // model's frozen tensors then use `base`'s values in place, with no copy (as
  // ModelPart::LoadBase); `base` must outlive the model or the next LoadBase, and not
  // change meanwhile; SetParameters, which writes every tensor, must not be called in
  // between. INVALID_ARGUMENT (nothing changed) for a tensor missing, extra or of
  // another shape.
  Status LoadBase(const ParameterSet& base);

  // A quantized base (ModelSpec::quantize): its weights, sharing their bytes (empty for a
  // model without one), and their replacement by `set`'s, whose bytes are shared, not
  // copied. INVALID_ARGUMENT (nothing changed) unless `set` is in the model's codec and
  // has each of its quantized weights with its shape (more are ignored).
  QuantizedSet QuantizedBase() const;
  Status LoadQuantized(const QuantizedSet& set);

  // Loads the loss for loss "torchscript": a scripted module whose forward(output,
  // target) returns the batch's mean loss as a scalar, `target` being the labels (int64)
  // or, for regression data, the targets (float32). INVALID_ARGUMENT when the archive
  // does not load or its forward does not take two arguments.
  Status SetTorchScriptLoss(const std::string& archive);

  // Trains on `data` with the options' loss and optimizer.
  StatusOr<TrainStats> Train(const Dataset& data, const LocalTrainOptions& options);
  // The mean `loss` and the task's metrics on `data`. The task follows from the loss and
  // the data: regression (targets), binary (bce, or torchscript with one output) or
  // classification.
  StatusOr<EvalStats> Evaluate(const Dataset& data, int batch_size,
                               const std::string& loss = "cross_entropy") const;

  // Classification models: the outputs (logits) for every example of `data`,
  // [data.size, classes] row-major (a teacher's, for Distill).
  StatusOr<std::vector<float>> Outputs(const Dataset& data, int batch_size);
  // Ensemble distillation (FedDF, Lin et al. 2020): o.steps Adam steps, each on a batch
  // of `data` drawn at random (its labels unused), minimising T² KL(softmax(teacher / T)
  // || softmax(outputs / T)) with `teacher_logits` in Outputs' layout (an ensemble's
  // mean). Returns the mean loss of the last ten steps.
  StatusOr<double> Distill(const Dataset& data, const std::vector<float>& teacher_logits,
                           const DistillOptions& o);

  int num_stages() const;

  // The tensors training leaves as they are (a LoRA model's base weights), in model
  // order; empty when every tensor trains. Updates leave them out.
  std::vector<std::string> FrozenTensors() const;

  // Text models: the logits [ids.size(), vocab] (row-major) of the next token after
  // each prefix of `ids`. Errors as Generate's.
  StatusOr<std::vector<float>> Logits(const std::vector<int32_t>& ids);
  // Text models: extends `prompt` (token ids) by up to `tokens` ids sampled one at a
  // time from the model's next-token distribution at `temperature` (0: the most likely
  // token), restricted to the `top_k` most likely when top_k > 0, then to the smallest
  // set of them whose probability reaches `top_p` when top_p < 1 (nucleus sampling, as
  // transformers' TopPLogitsWarper), seeded by `seed`; it stops after `eos` (>= 0).
  // Only the last `context` tokens are fed back (a Llama-family model keeps its keys and
  // values, models/llama.h). Returns the new ids only.
  // FAILED_PRECONDITION for a model that is not a language model, INVALID_ARGUMENT for
  // an empty prompt or ids outside the vocabulary.
  StatusOr<std::vector<int32_t>> Generate(const std::vector<int32_t>& prompt, int tokens,
                                          double temperature, int top_k, uint64_t seed,
                                          double top_p = 1.0, int32_t eos = -1);

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// OK when `data`'s examples have the model's input shape and its labels or targets suit
// `loss` and the model's outputs (text: model gpt, loss cross_entropy, the tokenizer's
// vocabulary the model's, sequences no longer than its context, every id in the
// vocabulary) (cross_entropy: labels below num_classes; bce: one
// output, labels 0 or 1; mse, mae: one output, regression targets; torchscript: labels
// below num_classes when that is > 1, else anything); else
// INVALID_ARGUMENT naming `what` (the data's origin) and both.
Status CheckDataFitsModel(const Dataset& data, const ModelSpec& spec, const std::string& loss,
                          const std::string& what);

// Sets LibTorch's intra-op thread count for this process (this thread, and every thread
// that calls UseTorchThreads).
void SetTorchThreads(int threads);
// LibTorch's CPU buffers of 16 MiB and more (a language model's logits, an embedding's
// gradient: what glibc maps fresh, and the kernel faults in and zeroes page by page,
// every step) are kept when freed, by exact size, for the next request of that size, up
// to `max_cached_bytes` of them (0: each is freed at once). The first call installs the
// allocator for the process; SetTorchThreads makes that call with kTorchBufferCacheBytes
// unless one came first. It costs memory only between steps (what a step freed), not at
// a step's peak, unless sizes change from step to step.
inline constexpr int64_t kTorchBufferCacheBytes = int64_t{1} << 30;
void SetTorchBufferCache(int64_t max_cached_bytes);
// OpenMP keeps its thread count per thread, and a new thread starts from the default
// (the core count), not from SetTorchThreads: each LibTorch op it runs would then keep
// an OpenMP team of its own. A thread that runs LibTorch work calls this first (no-op
// before SetTorchThreads).
void UseTorchThreads();

}  // namespace cleave
