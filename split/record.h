// What an honest-but-curious server keeps of a split task when the job asks for it
// (split.record: N): the client part it sent, and each of the first N micro-batches as it
// crossed the cut (the activations, the labels when they travel, the gradient). One
// encoded ParameterSet per task (RUN_DIR/record/round-R/CLIENT.pb): tensors "part/NAME",
// "cut" (one value: the stage the activations are the input of), "act/K", "labels/K"
// (as float32) and "grad/K", K from 0. The attacks (split/attacks.h, models/inversion.h)
// read it; nothing of it reaches a client.
//
// And a federated round's update (server.record_updates): "part/NAME" the model the
// client was sent, "update/NAME" its update as received, no micro-batch.
//
// The same format holds a device's own copy of what it sent (cleave-client --keep-sent):
// "act/K" is then the micro-batch's input (before the client part) and "labels/K" its
// labels, the truth a measurement scores the server's attacks against (a whole-model
// task's: its first batch). It stays on the device.
#pragma once

#include <string>
#include <vector>

#include "core/parameter_set.h"
#include "core/status.h"

namespace cleave {

struct RecordedBatch {
  Tensor activations;           // [B, <the cut stage's input>]
  std::vector<int64_t> labels;  // as received (a language model: one per token); empty U-shaped
  Tensor gradient;              // the gradient of the activations (sl/sfl: sent; U-shaped: of the middle's output, received)
  Tensor reconstruction;        // split.hijack: the hijack's decoder's inputs for them, after its step ("recon/K")
};

struct SplitRecord {
  ParameterSet part;  // the client part's values as the server sent them (an update's: the model)
  ParameterSet update;  // server.record_updates: a whole-model update as received, "update/NAME"
  int cut = 0;        // the stage the recorded activations are the input of (0: unknown)
  std::vector<RecordedBatch> batches;
};

// Collects a task's first `limit` micro-batches and writes them to `path` when full, or
// when it is destroyed with some (a task with fewer batches). Not thread-safe: one per
// split stream.
class SplitRecorder {
 public:
  SplitRecorder(std::string path, int limit) : path_(std::move(path)), limit_(limit) {}
  ~SplitRecorder();
  bool wants() const { return !path_.empty() && static_cast<int>(record_.batches.size()) < limit_ && !written_; }
  bool empty() const { return record_.batches.empty(); }
  // The part and the cut are taken with the first batch.
  void Add(const ParameterSet& part, int cut, RecordedBatch batch);

 private:
  Status Write();
  std::string path_;
  int limit_;
  bool written_ = false;
  SplitRecord record_;
};

std::string EncodeSplitRecord(const SplitRecord& r);
StatusOr<SplitRecord> DecodeSplitRecord(const std::string& bytes);

}  // namespace cleave
