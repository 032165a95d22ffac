// Split-learning tensors of any size: a message whose tensor exceeds one chunk sends
// its first chunk in the message (TensorData.more) and the rest in SplitChunk messages
// right after it, on either direction of the stream. Used by the server's split
// reactor and the client's split task alike (docs/protocol.md, "Split learning").
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cleave/v1/cleave.pb.h"
#include "core/status.h"

namespace cleave {

inline constexpr size_t kSplitChunkBytes = size_t{1} << 20;

// The tensor a split message carries and its micro-batch (nullptr for none).
inline v1::TensorData* SplitTensor(v1::SplitUp& m, int64_t* seq) {
  if (m.has_batch()) return *seq = m.batch().seq(), m.mutable_batch()->mutable_activations();
  if (m.has_grad()) return *seq = m.grad().seq(), m.mutable_grad()->mutable_grad();
  return nullptr;
}
inline v1::TensorData* SplitTensor(v1::SplitDown& m, int64_t* seq) {
  if (m.has_result()) return *seq = m.result().seq(), m.mutable_result()->mutable_grad();
  if (m.has_forward()) return *seq = m.forward().seq(), m.mutable_forward()->mutable_activations();
  return nullptr;
}

// `msg` followed by the chunks that carry its tensor beyond the first kSplitChunkBytes:
// the messages to send, in order.
template <typename Message>
std::vector<Message> Chunked(Message msg) {
  int64_t seq = 0;
  v1::TensorData* t = SplitTensor(msg, &seq);
  if (t == nullptr || t->data().size() <= kSplitChunkBytes) return {std::move(msg)};
  const std::string data = std::move(*t->mutable_data());
  t->set_data(data.substr(0, kSplitChunkBytes));
  t->set_more(true);
  std::vector<Message> out;
  out.push_back(std::move(msg));
  for (size_t off = kSplitChunkBytes; off < data.size(); off += kSplitChunkBytes) {
    Message c;
    v1::SplitChunk* chunk = c.mutable_chunk();
    chunk->set_seq(seq);
    chunk->set_data(data.substr(off, kSplitChunkBytes));
    chunk->set_last(off + kSplitChunkBytes >= data.size());
    out.push_back(std::move(c));
  }
  return out;
}

// Puts messages back together on the receiving side. Not thread-safe.
template <typename Message>
class ChunkAssembler {
 public:
  // A tensor's data may not exceed `max_bytes`.
  explicit ChunkAssembler(size_t max_bytes) : max_bytes_(max_bytes) {}

  // The whole message once `msg` completes one; nullopt while a tensor is incomplete.
  // INVALID_ARGUMENT for a chunk with no tensor to continue (or of another micro-batch),
  // another message while a tensor is incomplete, or a tensor over max_bytes.
  StatusOr<std::optional<Message>> Add(Message msg) {
    if (msg.has_chunk()) {
      if (!partial_) return absl::InvalidArgumentError("a tensor chunk with no tensor to continue");
      int64_t seq = 0;
      v1::TensorData* t = SplitTensor(*partial_, &seq);
      if (msg.chunk().seq() != seq) {
        return absl::InvalidArgumentError(absl::StrCat("a chunk of micro-batch ", msg.chunk().seq(),
                                                       " inside micro-batch ", seq));
      }
      if (t->data().size() + msg.chunk().data().size() > max_bytes_) {
        return absl::InvalidArgumentError(
            absl::StrCat("a tensor of more than ", max_bytes_, " bytes"));
      }
      t->mutable_data()->append(msg.chunk().data());
      if (!msg.chunk().last()) return std::optional<Message>();
      t->set_more(false);
      std::optional<Message> whole = std::move(partial_);
      partial_.reset();
      return whole;
    }
    if (partial_) {
      return absl::InvalidArgumentError("a message inside an unfinished chunked tensor");
    }
    int64_t seq = 0;
    v1::TensorData* t = SplitTensor(msg, &seq);
    if (t != nullptr && t->more()) {
      if (t->data().size() > max_bytes_) {
        return absl::InvalidArgumentError(absl::StrCat("a tensor of more than ", max_bytes_, " bytes"));
      }
      partial_ = std::move(msg);
      return std::optional<Message>();
    }
    return std::optional<Message>(std::move(msg));
  }

 private:
  const size_t max_bytes_;
  std::optional<Message> partial_;
};

}  // namespace cleave
