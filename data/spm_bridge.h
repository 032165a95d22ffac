// Internal to data/: SentencePiece through the cleave-spm helper process
// (cmd/cleave_spm.cc). Debian's libsentencepiece exports its own copy of protobuf-lite,
// which collides with libprotobuf (gRPC, LibTorch) in one process, so nothing of ours
// links it. The helper is found as $CLEAVE_SPM, else beside the running executable,
// else on PATH.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace cleave {

class SpmProcessor {
 public:
  // Reads the model's vocabulary size and end-of-text id. NOT_FOUND when the helper is
  // missing, DATA_LOSS when the model does not load.
  static StatusOr<SpmProcessor> Load(const std::string& path);

  int vocab_size() const { return vocab_; }
  int eos_id() const { return eos_; }  // -1 when the model has none
  StatusOr<std::vector<std::vector<int32_t>>> Encode(const std::vector<std::string>& texts) const;
  StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;

 private:
  std::string path_;
  int vocab_ = 0, eos_ = -1;
};

// Runs SentencePieceTrainer with spm_train's `flags` ("--input=...", ...).
Status TrainSpm(const std::vector<std::string>& flags);

}  // namespace cleave
