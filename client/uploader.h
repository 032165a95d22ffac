// Internal to client/. Uploader: a client's uploads, one of its components: an update
// encoded with the task's codec (its error-feedback state kept across rounds while the
// codec and the tensors it encodes stay the same), and --keep-sent's copy of what a
// device sent (STATE_DIR/sent/). Used by one task at a time (the session's thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "cleave/v1/cleave.grpc.pb.h"
#include "client/client.h"
#include "client/emulation.h"
#include "compression/codec.h"
#include "core/parameter_set.h"
#include "core/status.h"
#include "models/model.h"

namespace cleave {

class Uploader {
 public:
  Uploader(const ClientOptions& opts, DeviceEmulator* emulator)
      : opts_(opts), emulator_(emulator) {}

  // Uploads `delta` (trained minus global) as the result of `task`, with what the
  // client reports beside it.
  StatusOr<v1::UploadReply> Upload(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                   const v1::Task& task, const ParameterSet& delta,
                                   int64_t examples, double loss, double seconds,
                                   const v1::SplitStats* split,
                                   const v1::ClientEvaluation* evaluation = nullptr,
                                   const v1::GossipStats* gossip = nullptr);
  // --keep-sent: where this device keeps its copy of what it sent in `task`,
  // STATE_DIR/sent/round-R/CLIENT_ID.pb.
  std::string SentPath(const v1::Task& task, const v1::Welcome& w) const;
  // --keep-sent: a whole-model task's first batch (Model::Train's with `o`), its inputs
  // and labels, into SentPath; a failure is logged.
  void KeepFirstBatch(const v1::Task& task, const v1::Welcome& w, const LocalTrainOptions& o) const;

 private:
  const ClientOptions& opts_;
  DeviceEmulator* const emulator_;
  std::unique_ptr<Codec> codec_;  // the update codec and its state
  std::string codec_key_;         // its spec and the tensors it encoded
};

}  // namespace cleave
