// SplitStream: one split stream's protocol, without gRPC. A split task's client sends
// its micro-batches in order (sequence numbers from 1); the stream decodes each tensor
// with the codec the task set, checks it against the task (shape, size, labels) and
// runs it through the round's SplitRound: a server step that answers with the gradient
// at the cut, or in U-shaped learning the middle's forward pass, answered later by the
// client's gradient for a pending micro-batch. Tensors of any size arrive in chunks
// (proto/split_chunks.h) and go back down in chunks.
//
// The transport's SplitReactor queues messages and hands them here one at a time;
// it holds no protocol state of its own. Not thread-safe: one Process at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <map>
#include <vector>

#include "cleave/v1/cleave.pb.h"
#include "compression/codec.h"
#include "core/status.h"
#include "proto/split_chunks.h"
#include "server/coordinator.h"
#include "split/record.h"
#include "split/round.h"

namespace cleave {

class SplitStream {
 public:
  // `task`: what Coordinator::OpenSplit gave the stream. `core` counts what crossed.
  SplitStream(Coordinator& core, SplitStreamTask task);

  // A message of the stream: a whole one is processed and its answers returned, in
  // chunks; a tensor in chunks waits for its last chunk (no answer yet). An error is
  // INVALID_ARGUMENT for what the client got wrong (or the round's refusal) and ends
  // the stream.
  StatusOr<std::vector<v1::SplitDown>> Process(v1::SplitUp in);

  const SplitStreamTask& task() const { return task_; }

 private:
  // `spec` is the codec the task set for this kind of tensor ("" = float32).
  StatusOr<Activations> FromWire(const v1::TensorData& t, const std::string& spec,
                                 const Codec* codec) const;
  void ToWire(const Activations& a, const std::string& spec, Codec* codec,
              v1::TensorData* t) const;
  // split.record: one micro-batch as it crossed, with what the round's hijack
  // (split.hijack) reads of it.
  void Record(Tensor activations, std::vector<int64_t> labels, const Activations& gradient);

  Coordinator& core_;
  const SplitStreamTask task_;
  int64_t next_seq_ = 1;
  std::map<int64_t, bool> pending_;  // U-shaped: micro-batches whose gradient is due -> batch_end
  std::unique_ptr<Codec> act_codec_, grad_codec_;  // this stream's (stochastic rounding)
  ChunkAssembler<v1::SplitUp> assembler_;
  // split.record: what this stream's first micro-batches brought and took; U-shaped,
  // each one's activations until its gradient arrives.
  SplitRecorder recorder_;
  std::map<int64_t, Tensor> recording_;
};

}  // namespace cleave
