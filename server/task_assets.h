// TaskAssets: what every task of the run names besides its round's model, one of the
// coordinator's components: the model's description, and the blobs devices fetch once
// (a LoRA model's frozen base, a quantized base, a TorchScript loss; the probe blob that
// profiling clients time their downlink with), pinned in the blob store. Fixed once the
// model is loaded: read without a lock.
#pragma once

#include "cleave/v1/cleave.pb.h"
#include "server/blob_store.h"

namespace cleave {

struct TaskAssets {
  v1::ModelDescription model;
  BlobRef base;            // a LoRA model's frozen tensors (Task.base_digest)
  BlobRef quantized_base;  // model.quantize's weights (Task.quantized_base_digest)
  BlobRef loss;            // train.loss: torchscript's module (TrainConfig.loss_digest)
  BlobRef probe;           // what profiling clients time their downlink with

  // Names the model, base, quantized base and loss in `task`.
  void NameIn(v1::Task* task) const {
    *task->mutable_model() = model;
    task->mutable_train()->set_loss_digest(loss.digest);
    task->mutable_train()->set_loss_size(loss.size);
    task->set_base_digest(base.digest);
    task->set_base_size(base.size);
    task->set_quantized_base_digest(quantized_base.digest);
    task->set_quantized_base_size(quantized_base.size);
  }
};

}  // namespace cleave
