// Internal to client/. ModelCache: the model a client's tasks run on, kept across tasks,
// one of the client's components. It holds
//   the whole model, built once per description (a task that describes another
//     rebuilds it, and the personal layers of the old one go);
//   what seldom changes, fetched once per digest: a TorchScript model's archive, a LoRA
//     model's frozen base, a quantized base, a TorchScript loss;
//   this device's personal layers (ModelDescription.personal, and a model kind's private
//     tensors), restored from --state-dir after a restart and saved there as they train;
//   the memory check's estimate, once per model and training settings.
// Used by one task at a time (the session's thread), so it has no lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cleave/v1/cleave.grpc.pb.h"
#include "client/client.h"
#include "client/emulation.h"
#include "compression/quantized_set.h"
#include "core/fit.h"
#include "core/parameter_set.h"
#include "core/status.h"
#include "models/model.h"

namespace cleave {

class ModelCache {
 public:
  ModelCache(const ClientOptions& opts, DeviceEmulator* emulator)
      : opts_(opts), emulator_(emulator) {}

  // The model a task or welcome describes (fetching a TorchScript archive once).
  StatusOr<ModelSpec> Spec(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                           const v1::ModelDescription& d);
  // The task's model: its blob fetched and decoded (with the task's broadcast codec).
  StatusOr<ParameterSet> FetchGlobal(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                     const v1::Task& task);

  // The global model a task starts from, checked against the local data; the model's
  // frozen and quantized bases fetched once. An error here declines the task.
  struct TaskModel {
    ModelSpec spec;
    std::string loss;
    ParameterSet global;
  };
  StatusOr<TaskModel> Fetch(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                            const v1::Task& task);
  // Whole-model tasks: the model built from `m.spec` and set to the global model (its
  // frozen tensors the values of the base, in place; this client's personal layers
  // written over it; a TorchScript loss fetched once). `m.global` keeps the tensors an
  // update carries (Model::TrainedParameters's layout), with the personal layers.
  // Returns the personal layers' names; an error declines the task.
  StatusOr<std::vector<std::string>> Set(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                         const v1::Task& task, TaskModel& m);
  // (Re)builds the whole model when the task's description changed.
  Status Build(const v1::Task& task, const ModelSpec& spec);
  // --memory-limit-mb: OK when training `spec` as `fit` says fits beside what this
  // process holds now; else RESOURCE_EXHAUSTED with both figures. What training adds is
  // the cut policy's memory model for the whole model on this device (gradients,
  // optimizer state, the activations a batch keeps; from ProfileStages here, once per
  // model and settings) plus one more copy of the parameters (the trained model beside
  // the global one; the update is made in place of one of them).
  Status CheckMemory(const v1::Task& task, const ModelSpec& spec, const FitSettings& fit);
  // Whether a task's frozen base is read from opts.model_dir instead of fetched: split
  // tasks of model hf with a base, except U-shaped ones.
  bool BaseFromFolder(const v1::Task& task, const ModelSpec& spec) const;

  // The model built for the last task (null before the first, and after Drop).
  Model* model() const { return model_.get(); }
  // A virtual client of a simulation keeps no model between its tasks: only those
  // working hold training state (its personal layers stay).
  void Drop() {
    model_.reset();
    loss_digest_.clear();
  }
  // A LoRA model's frozen tensors (Task.base_digest) and a quantized base's weights
  // (Task.quantized_base_digest), as the last task that named them fetched them: the
  // frozen tensors of the model and of a split part are these values, not copies.
  const ParameterSet& base() const { return base_; }
  const QuantizedSet& quantized_base() const { return quantized_base_; }

  // This device's personal layers for `task`: the ones held, else those saved for this
  // run and model that fit `model` (names `names`); none before the first is trained.
  const ParameterSet& Personal(const v1::Task& task, const std::vector<std::string>& names,
                               const ParameterSet& model);
  // The personal layers `task` trained: held, and saved under --state-dir.
  void KeepPersonal(const v1::Task& task, ParameterSet personal);

 private:
  // Where this client keeps its personal layers ("" = in memory only), and the key that
  // ties them to a task's run and model.
  std::string PersonalFile() const;
  static std::string PersonalKey(const v1::Task& task);
  StatusOr<std::string> FetchBlob(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                  const std::string& digest);

  const ClientOptions& opts_;
  DeviceEmulator* const emulator_;
  std::unique_ptr<Model> model_;
  std::string model_key_;    // the description `model_` was built from
  ParameterSet personal_;    // as this client last trained them; never leave the client
  std::string loss_digest_;  // the TorchScript loss `model_` holds (TrainConfig.loss_digest)
  std::string base_digest_;  // fetched once and decoded (the received bytes freed)
  ParameterSet base_;
  std::string quantized_digest_;  // fetched once; the models built from it share its bytes
  QuantizedSet quantized_base_;
  std::string script_digest_;  // the archive held in script_bytes_
  std::string script_bytes_;
  std::string memory_key_;  // the model and settings memory_need_ was measured for
  int64_t memory_need_ = 0;
};

// The personal tensors saved in `path` ("KEY\n" then a parameter set) if they were saved
// for `key` (this run and model) and fit `global`; else none, with a warning when the
// file exists but does not fit.
ParameterSet LoadPersonal(const std::string& path, const std::string& key,
                          const std::vector<std::string>& names, const ParameterSet& global);

}  // namespace cleave
