// Internal to server/: what the transport's reactors share (status conversion, the
// caller's identity, wire sizes, the queued bidirectional stream), and the streams'
// reactors in rpc_streams.cc (uploads, split streams, link probes), which RpcService
// (rpc.cc) creates.
#pragma once

#include <google/protobuf/message_lite.h>
#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "cleave/v1/cleave.grpc.pb.h"
#include "core/grpc_status.h"
#include "core/status.h"
#include "privacy/tls.h"

namespace cleave {

class Coordinator;

namespace rpc_internal {

// A reactor that ends its call at once with `status` (a call refused before any work).
template <class Reactor>
class Refusal final : public Reactor {
 public:
  explicit Refusal(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

// The CN of the call's verified client certificate; empty without mutual TLS.
inline std::string PeerIdentity(const grpc::CallbackServerContext* ctx) { return PeerCommonName(*ctx); }

// What a message takes on the transport: its protobuf encoding, gRPC's 5-byte message
// prefix and a 9-byte HTTP/2 frame header per started 16 KiB DATA frame. Checked against
// the bytes a TCP proxy counts (tests/integration/traffic_test.cc).
inline int64_t WireSize(int64_t encoded_bytes) {
  const int64_t n = encoded_bytes + 5;
  return n + 9 * ((n + 16383) / 16384);
}
inline int64_t WireSize(const google::protobuf::MessageLite& m) {
  return WireSize(static_cast<int64_t>(m.ByteSizeLong()));
}
// Each call's HTTP/2 HEADERS frames (method, path, content type, deadline; then status
// and trailers), HPACK-compressed after a connection's first call, plus the stream's
// share of flow-control frames: measured on loopback, see traffic_test.cc.
constexpr int64_t kCallBytesUp = 60, kCallBytesDown = 40;
// A client's first call also opens its connection: the HTTP/2 preface, SETTINGS and
// headers not yet in the HPACK table.
constexpr int64_t kConnectionBytesUp = 220;

// ---------------------------------------------------------------------------------
// A bidirectional stream whose writes are queued: one write in flight at a time.
// Owned by shared_ptr (the server may hold one) so that Send/Close may be called after
// the stream ended; no gRPC operation is ever started while one of our mutexes is held,
// since gRPC may run the resulting reaction inline.
template <class In, class Out>
class QueuedBidiReactor : public grpc::ServerBidiReactor<In, Out> {
 public:
  // Queues a message. Returns false if the stream is finishing.
  bool Send(Out msg, bool finish_after = false) {
    const Out* start = nullptr;
    {
      MutexLock l(&wmu_);
      if (finishing_) return false;
      Queued(msg);
      out_.push_back(std::move(msg));
      if (finish_after) finish_after_writes_ = true;
      // Only OnWriteDone pops, and not before this write completes: the element stays.
      if (!writing_) start = &out_.front();
      writing_ = true;
    }
    if (start != nullptr) this->StartWrite(start);
    return true;
  }

  // Ends the stream with `s` once the messages already queued are written.
  void Close(const grpc::Status& s) {
    bool now = false;
    {
      MutexLock l(&wmu_);
      now = FinishLocked(s);
    }
    if (now) this->Finish(s);
  }

  void OnWriteDone(bool ok) override {
    const Out* next = nullptr;
    bool finish = false;
    grpc::Status status;
    {
      MutexLock l(&wmu_);
      out_.pop_front();
      if (!ok) {
        out_.clear();
        writing_ = false;
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed");
        finish = FinishLocked(status);
      } else if (!out_.empty()) {  // also when finishing: what was queued goes first
        next = &out_.front();
      } else {
        writing_ = false;
        if (finish_after_writes_ || finishing_) {
          status = finishing_ ? pending_status_ : grpc::Status::OK;
          finish = FinishLocked(status);
        }
      }
    }
    if (next != nullptr) this->StartWrite(next);
    if (finish) this->Finish(status);
  }

 private:
  // Returns true when the caller must call Finish(s) now (after releasing wmu_).
  bool FinishLocked(const grpc::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(wmu_) {
    if (finished_) return false;
    if (!finishing_) pending_status_ = s;
    finishing_ = true;
    if (writing_) return false;  // OnWriteDone finishes
    finished_ = true;
    return true;
  }

  // Called for each message queued (with wmu_ held): to count it.
  virtual void Queued(const Out& msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(wmu_) = 0;

  Mutex wmu_;
  std::deque<Out> out_ ABSL_GUARDED_BY(wmu_);
  bool writing_ ABSL_GUARDED_BY(wmu_) = false;
  bool finishing_ ABSL_GUARDED_BY(wmu_) = false;
  bool finished_ ABSL_GUARDED_BY(wmu_) = false;
  bool finish_after_writes_ ABSL_GUARDED_BY(wmu_) = false;
  grpc::Status pending_status_ ABSL_GUARDED_BY(wmu_);
};

// The streams' reactors (rpc_streams.cc).
grpc::ServerReadReactor<v1::UploadChunk>* NewUploadReactor(Coordinator* core,
                                                           grpc::CallbackServerContext* ctx,
                                                           v1::UploadReply* reply);
grpc::ServerBidiReactor<v1::SplitUp, v1::SplitDown>* NewSplitReactor(Coordinator* core,
                                                                     const std::string& peer);
grpc::ServerReadReactor<v1::ProbeChunk>* NewProbeReactor(Coordinator* core, v1::ProbeReply* reply,
                                                         const std::string& peer);

}  // namespace rpc_internal
}  // namespace cleave
