// The client's side of a split-learning task: trains its stages of the model against
// the server over one Split stream (see docs/split-learning.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>

#include "cleave/v1/cleave.grpc.pb.h"
#include "client/emulation.h"
#include "core/parameter_set.h"
#include "core/status.h"
#include "data/dataset.h"
#include "models/model.h"
#include "models/part.h"
#include "privacy/split_guard.h"

namespace cleave {

struct SplitTaskResult {
  ParameterSet trained;   // the client part after training (the layout of `part`)
  ParameterSet own;       // with SplitTaskOptions::own: the device's own stages, trained
  int64_t examples = 0;   // per epoch
  double loss = 0;        // mean loss over the last epoch
  v1::SplitStats stats;
};

// A device whose stages are its caller's code (the Python package's split clients,
// ClientOptions::external.split), in sl, sfl-v1 and sfl-v2: the task's part (the values
// of the device's stages the server sent) goes to `begin`, which returns the examples of
// an epoch; `forward` gives the next batch's activations at the cut and its labels (none
// when the epoch has ended; the next call starts another); `backward` takes the gradient
// of batch `seq`'s activations (and steps the caller's optimizer); `parameters` is the
// trained part, in the part's order and shapes. The stream, codecs, activation noise and
// window are this client's, as for its own stages.
struct ExternalSplit {
  struct Batch {
    Activations activations;
    std::vector<int64_t> labels;
  };
  std::function<StatusOr<int64_t>(const v1::Task& task, const ParameterSet& part)> begin;
  std::function<StatusOr<std::optional<Batch>>(int64_t seq)> forward;
  std::function<Status(int64_t seq, const Activations& grad)> backward;
  std::function<StatusOr<ParameterSet>()> parameters;
};

// How a pipeline's device dials its next one (split.mode: pipeline).
struct PeerLink {
  std::string ca, cert, key;  // this device's TLS files ("" ca: plaintext)
  std::string name;           // this device's name: the sender its neighbour expects
};

struct SplitTaskOptions {
  ModelSpec model;
  uint64_t seed = 0;                          // batch order
  DeviceEmulator* emulator = nullptr;
  const std::atomic<bool>* cancel = nullptr;  // checked before every micro-batch
  // Test hook, called after each completed step: true drops the stream (a crash).
  std::function<bool(int64_t step)> crash_after_step;
  // A LoRA model's frozen tensors (Task.base_digest): the part then holds the adapters
  // only, and the frozen tensors of the client's stages come from here.
  const ParameterSet* base = nullptr;  // its frozen tensors use these values in place
  // A quantized base's weights for the part (Task.quantized_base_digest), or nullptr.
  const QuantizedSet* quantized = nullptr;
  // Instead of `base`: the model's Hugging Face folder on this device
  // (ClientOptions::model_dir), from which the part reads its frozen tensors
  // (ModelPart::LoadHfFolder); FAILED_PRECONDITION unless they are the server's (their
  // encoding's digest is the task's base_digest). Not for U-shaped tasks.
  std::string model_dir;
  // A pipeline's data owner: how it dials the chain's next device.
  PeerLink peer;
  // Interoperable architectures (model.name interop): the device's own values of its
  // stages (its private base and fusion), which the server never sends; the task's part
  // is then empty, and the trained values come back in SplitTaskResult::own. Given the
  // part's initial values, returns the ones to train from (this device's, where it has
  // trained them before).
  std::function<StatusOr<ParameterSet>(ParameterSet initial)> own;
  // The device's stages in its caller's code instead of the model's (`data` unused).
  const ExternalSplit* external = nullptr;
  // ClientOptions::keep_sent: where the inputs and labels of the first `keep_sent`
  // micro-batches go (a SplitRecord), or "".
  std::string sent_path;
  int keep_sent = 0;
  // ClientOptions::split_guard's guard, kept by the client across its tasks (its warm-up
  // and its evidence span them), or nullptr. Not for U-shaped, pipeline or external
  // tasks, whose labels do not reach the server (FAILED_PRECONDITION).
  SplitGuard* guard = nullptr;
};

// The local training a task's TrainConfig asks for (whole-model or split); the caller
// sets `cancel` and `seed`.
LocalTrainOptions TrainOptions(const v1::TrainConfig& tc);

// Runs `task` (task.split() set) from `part`, the client part the server published
// (with options.base, its trainable tensors). The trained part comes back in `part`'s
// layout.
StatusOr<SplitTaskResult> RunSplitTask(v1::Coordinator::Stub* stub, const v1::Welcome& welcome,
                                       const v1::Task& task, const ParameterSet& part,
                                       const Dataset& data, const SplitTaskOptions& options);

// A split task's client part `p` with its frozen tensors read from the model's folder
// `dir` (SplitTaskOptions::model_dir), its adapters from `part` (the task's) and a
// quantized base's weights from `quantized` (or none). FAILED_PRECONDITION naming `dir`
// unless the frozen tensors read are the server's: the digest of their encoding must be
// the task's `base_digest`.
Status LoadPartFromFolder(ModelPart& p, const ParameterSet& part, const std::string& dir,
                          const std::string& base_digest, const QuantizedSet* quantized);

// Loads a split task's part `p`: its frozen tensors from options.model_dir (as
// LoadPartFromFolder) or options.base, the rest from `part`, a quantized base's weights
// from options.quantized.
Status LoadSplitPart(ModelPart& p, const ParameterSet& part, const v1::Task& task, const SplitTaskOptions& o);

// Measures this device for the server's cut policy: every stage's time (scaled by the
// emulated slowdown) and the link, with the probe blob and the Probe call.
StatusOr<v1::Profile> ProfileDevice(v1::Coordinator::Stub* stub, const v1::Welcome& welcome,
                                    const ModelSpec& model, const Dataset& data,
                                    int64_t memory_limit_bytes, DeviceEmulator* emulator);

}  // namespace cleave
