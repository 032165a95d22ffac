#include "server/rpc.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "cleave/v1/cleave.grpc.pb.h"
#include "compression/codec.h"
#include "core/files.h"
#include "core/printable.h"
#include "proto/split_chunks.h"
#include "server/accept_gate.h"
#include "server/coordinator.h"
#include "server/split_stream.h"

namespace cleave {

namespace {

// A reactor that ends its call at once with `status` (a call refused before any work).
template <class Reactor>
class Refusal final : public Reactor {
 public:
  explicit Refusal(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

grpc::Status ToGrpc(const Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// The CN of the call's verified client certificate; empty without mutual TLS.
std::string PeerIdentity(const grpc::CallbackServerContext* ctx) {
  const auto auth = ctx->auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return "";
  const auto cn = auth->FindPropertyValues("x509_common_name");
  return cn.empty() ? "" : std::string(cn[0].data(), cn[0].size());
}

// What a message takes on the transport: its protobuf encoding, gRPC's 5-byte message
// prefix and a 9-byte HTTP/2 frame header per started 16 KiB DATA frame. Checked against
// the bytes a TCP proxy counts (tests/integration/traffic_test.cc).
int64_t WireSize(int64_t encoded_bytes) {
  const int64_t n = encoded_bytes + 5;
  return n + 9 * ((n + 16383) / 16384);
}
int64_t WireSize(const google::protobuf::MessageLite& m) {
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

// ---------------------------------------------------------------------------------
// Control stream: one per client; the coordinator holds it as the session's link.
class ControlReactor : public QueuedBidiReactor<v1::ClientMessage, v1::ServerMessage>,
                       public ClientLink {
 public:
  static ControlReactor* Create(Coordinator* core, std::string peer) {
    auto r = std::shared_ptr<ControlReactor>(new ControlReactor(core, std::move(peer)));
    r->self_ = r;
    core->CountUp(kCallBytesUp);
    core->CountDown(kCallBytesDown);
    r->StartRead(&r->in_);
    return r.get();
  }

  bool Send(v1::ServerMessage msg, bool finish_after) override {
    return QueuedBidiReactor::Send(std::move(msg), finish_after);
  }
  void Close(const Status& why) override { QueuedBidiReactor::Close(ToGrpc(why)); }
  using QueuedBidiReactor::Close;

  void OnReadDone(bool ok) override {
    if (!ok) {
      // A client closes its control stream by cancelling it (then this status goes
      // nowhere); a read also fails on bytes that do not decode as a ClientMessage.
      Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         "control stream: a message did not decode, or the client half-closed "
                         "the stream (it must stay open while the client takes part)"));
      return;
    }
    core_->CountUp(WireSize(in_));
    if (client_id_.empty()) {
      if (in_.kind_case() != v1::ClientMessage::kJoin) {
        Close(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                           "the first message on the control stream must be Join"));
        return;
      }
      core_->CountUp(kConnectionBytesUp);
      v1::Welcome welcome;
      Status s = core_->Join(self_, in_.join(), peer_, &welcome);
      if (!s.ok()) {
        Close(ToGrpc(s));
        return;
      }
      client_id_ = welcome.client_id();
      v1::ServerMessage msg;
      *msg.mutable_welcome() = welcome;
      Send(std::move(msg), false);
      core_->Ready(client_id_);
    } else {
      switch (in_.kind_case()) {
        case v1::ClientMessage::kHeartbeat:
          core_->Heartbeat(client_id_);
          break;
        case v1::ClientMessage::kAck:
          core_->Heartbeat(client_id_);
          core_->Ack(client_id_, in_.ack());
          break;
        case v1::ClientMessage::kProfile:
          if (Status s = core_->SetProfile(client_id_, in_.profile()); !s.ok()) {
            Close(ToGrpc(s));
            return;
          }
          break;
        default:
          Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             "unexpected message on the control stream after Join"));
          return;
      }
    }
    StartRead(&in_);
  }

  void OnDone() override {
    core_->ControlDone(client_id_, this);
    self_.reset();  // may delete this
  }

 private:
  ControlReactor(Coordinator* core, std::string peer) : core_(core), peer_(std::move(peer)) {}
  void Queued(const v1::ServerMessage& msg) override { core_->CountDown(WireSize(msg)); }

  Coordinator* core_;
  std::shared_ptr<ControlReactor> self_;
  v1::ClientMessage in_;
  const std::string peer_;  // the client certificate's CN (mutual TLS)
  std::string client_id_;  // set after Join; read only by reactions
};

// ---------------------------------------------------------------------------------
// Blob download: one chunk written at a time, each a v1::Chunk encoded by hand so that
// its data is a slice of the blob itself (held by a reference to the blob, released
// when gRPC is done with the slice): a download in flight costs gRPC's own per-stream
// state (about 20 KB measured, bench_server_memory --fetchers), whatever
// server.chunk_bytes is, and every client's download shares the one copy.
class FetchReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(Coordinator* core, const v1::FetchRequest& req, const std::string& peer)
      : core_(core), start_(std::chrono::steady_clock::now()) {
    core_->CountUp(kCallBytesUp + WireSize(req));
    core_->CountDown(kCallBytesDown);
    auto blob = core_->FindBlob(req, peer, &fp32_size_);
    if (!blob.ok()) {
      Finish(ToGrpc(blob.status()));
      return;
    }
    blob_ = *std::move(blob);
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "download interrupted"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    const int64_t total = static_cast<int64_t>(blob_->size());
    if (offset_ >= total) {
      core_->SavedDown(fp32_size_ - total);
      core_->ObserveFetch(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
      Finish(grpc::Status::OK);
      return;
    }
    const int64_t n = std::min<int64_t>(core_->chunk_bytes(), total - offset_);
    // Chunk's offset and total_size, then its data field's tag and length, then the data.
    v1::Chunk head;
    head.set_offset(offset_);
    head.set_total_size(total);
    std::string prefix = head.SerializeAsString();
    google::protobuf::io::StringOutputStream out(&prefix);
    {
      google::protobuf::io::CodedOutputStream coded(&out);
      coded.WriteTag(v1::Chunk::kDataFieldNumber << 3 | 2);  // wire type 2: length-delimited
      coded.WriteVarint64(static_cast<uint64_t>(n));
    }
    auto* owner = new std::shared_ptr<const std::string>(blob_);
    grpc::Slice slices[2] = {
        grpc::Slice(prefix),
        grpc::Slice(const_cast<char*>(blob_->data() + offset_), static_cast<size_t>(n),
                    [](void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); },
                    owner)};
    chunk_ = grpc::ByteBuffer(slices, 2);
    offset_ += n;
    core_->CountDown(WireSize(static_cast<int64_t>(prefix.size()) + n));
    StartWrite(&chunk_);
  }

  Coordinator* core_;
  const std::chrono::steady_clock::time_point start_;  // for the latency histogram
  std::shared_ptr<const std::string> blob_;
  int64_t fp32_size_ = 0;  // what the blob would be as fp32
  int64_t offset_ = 0;
  grpc::ByteBuffer chunk_;
};

// ---------------------------------------------------------------------------------
// Update upload: header first, then data; validated and aggregated on the worker pool.
// Registered with the server while open, so that closing a round can cancel uploads
// that stall (a client that sends a header and then nothing would otherwise hold an
// upload slot for as long as its connection lives).
class UploadReactor : public grpc::ServerReadReactor<v1::UploadChunk>, public UploadCall {
 public:
  static UploadReactor* Create(Coordinator* core, grpc::CallbackServerContext* ctx,
                               v1::UploadReply* reply) {
    auto r = std::shared_ptr<UploadReactor>(new UploadReactor(core, ctx, reply));
    r->self_ = r;
    core->CountUp(kCallBytesUp);
    core->CountDown(kCallBytesDown);
    core->uploads().Register(r);
    r->StartRead(&r->in_);
    return r.get();
  }

  // Cancels the call if it is still receiving data; one that has all its data finishes
  // on its own once validated. Any thread.
  void Cancel() override {
    MutexLock l(&done_mu_);
    if (!done_ && !received_all_) ctx_->TryCancel();
  }

  // True, once, when the call has waited for its client longer than `limit` (the time
  // it spends queued for an upload slot does not count). Any thread.
  bool ExpireIfIdle(Clock::duration limit, Clock::time_point now) override {
    if (queued_.load() || received_all_flag_.load()) return false;
    if (now - Clock::time_point(Clock::duration(last_progress_.load())) <= limit) return false;
    return !expired_.exchange(true);
  }
  const v1::UploadHeader* header() const override { return have_header_flag_.load() ? &header_ : nullptr; }

  void OnReadDone(bool ok) override {
    Touch();
    if (!ok) {  // client finished writing
      if (!have_header_) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "upload without a header"));
        return;
      }
      if (static_cast<int64_t>(payload_.size()) != expected_) {
        Finish(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("upload ended after ", payload_.size(), " of ", expected_, " bytes")));
        return;
      }
      {
        MutexLock l(&done_mu_);
        received_all_ = true;
      }
      received_all_flag_ = true;
      core_->pool().Submit([this] {
        { MutexLock l(&payload_mu_); }  // see payload_mu_
        bool duplicate = false;
        Status s = core_->ProcessUpload(header_, payload_, &duplicate);
        core_->ReturnBuffer(std::move(payload_));
        if (!s.ok()) {
          core_->LogRefusedUpload(header_, s);
        } else {
          core_->ObserveUpload(
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
        }
        reply_->set_duplicate(duplicate);
        Finish(ToGrpc(s));
      });
      return;
    }
    core_->CountUp(WireSize(in_));
    if (!have_header_) {
      if (in_.kind_case() != v1::UploadChunk::kHeader) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "the first upload message must be the header"));
        return;
      }
      header_ = in_.header();
      // protocol.md: codec "none" is fp32.
      if (header_.codec() == "none") header_.set_codec("fp32");
      bool duplicate = false;
      auto expected = core_->CheckUploadHeader(header_, peer_, &duplicate);
      if (!expected.ok()) {
        core_->LogRefusedUpload(header_, expected.status());
        Finish(ToGrpc(expected.status()));
        return;
      }
      if (duplicate) {  // already counted: acknowledge without reading the payload
        reply_->set_duplicate(true);
        Finish(grpc::Status::OK);
        return;
      }
      expected_ = *expected;
      have_header_ = true;
      have_header_flag_ = true;
      // Hold at most server.worker_threads payloads in memory at once: without a slot,
      // stop reading and let HTTP/2 flow control hold the client back until Resume().
      if (!core_->uploads().Claim(header_.client_id(), this)) return;
      payload_ = core_->TakeBuffer(expected_);
    } else {
      if (in_.kind_case() != v1::UploadChunk::kData) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a second upload header"));
        return;
      }
      const std::string& d = in_.data();
      if (static_cast<int64_t>(payload_.size() + d.size()) > expected_) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("upload is larger than the announced ", expected_,
                                         " bytes")));
        return;
      }
      MutexLock l(&payload_mu_);
      payload_.append(d);
    }
    StartRead(&in_);
  }

  // Called by the server (under its upload mutex) when this upload queues for a slot,
  // and when it gets one: the time it waits queued is not idle time.
  void Queue() override { queued_ = true; }
  void Granted() override {
    Touch();
    queued_ = false;
  }
  // Called by the server when this waiting upload got its slot.
  void Resume() override {
    payload_ = core_->TakeBuffer(expected_);
    StartRead(&in_);
  }

  void OnCancel() override {
    if (core_->uploads().CancelWaiting(this)) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "upload cancelled while queued"));
    }
  }

  void OnDone() override {
    {
      MutexLock l(&done_mu_);
      done_ = true;
    }
    core_->uploads().Unregister(this);
    if (has_slot) core_->uploads().Release();
    self_.reset();  // may delete this
  }


 private:
  UploadReactor(Coordinator* core, grpc::CallbackServerContext* ctx, v1::UploadReply* reply)
      : core_(core), ctx_(ctx), peer_(PeerIdentity(ctx)), reply_(reply),
        start_(std::chrono::steady_clock::now()) {
    Touch();
  }

  void Touch() { last_progress_ = core_->clock().Now().time_since_epoch().count(); }

  Coordinator* core_;
  grpc::CallbackServerContext* ctx_;
  const std::string peer_;
  std::shared_ptr<UploadReactor> self_;
  Mutex done_mu_;
  bool done_ ABSL_GUARDED_BY(done_mu_) = false;
  bool received_all_ ABSL_GUARDED_BY(done_mu_) = false;
  v1::UploadReply* reply_;
  const std::chrono::steady_clock::time_point start_;  // for the latency histogram
  v1::UploadChunk in_;
  v1::UploadHeader header_;
  bool have_header_ = false;
  int64_t expected_ = 0;
  std::string payload_;
  // Taken around each append and once by the worker before it reads payload_. gRPC runs a
  // call's reactions one at a time, possibly on different threads, and orders them by
  // synchronization of its own, which ThreadSanitizer cannot see (gRPC is not
  // instrumented): this makes the hand-off from the appending reactions to the worker
  // visible. Never held while calling into gRPC.
  Mutex payload_mu_;
  // Read by the server's expiry check from another thread, which holds the upload
  // slots' mutex: it must not take done_mu_ (Cancel holds done_mu_ while TryCancel may
  // run OnCancel, which takes that mutex), hence atomics beside the fields done_mu_
  // guards.
  std::atomic<Clock::duration::rep> last_progress_{0};  // when the client last sent something
  std::atomic<bool> queued_{false};           // waiting for an upload slot
  std::atomic<bool> received_all_flag_{false};
  std::atomic<bool> have_header_flag_{false};  // header_ is set and stays unchanged
  std::atomic<bool> expired_{false};
};

// ---------------------------------------------------------------------------------
// Split stream: one per split task. Messages are processed in order on the worker pool,
// one at a time per stream, never inside a reaction; reading pauses while `window`+1
// messages wait, so a client cannot queue unbounded work.
class SplitReactor : public QueuedBidiReactor<v1::SplitUp, v1::SplitDown> {
 public:
  static SplitReactor* Create(Coordinator* core, std::string peer) {
    auto r = std::shared_ptr<SplitReactor>(new SplitReactor(core, std::move(peer)));
    r->self_ = r;
    core->CountSplitUp(kCallBytesUp);
    core->CountSplitDown(kCallBytesDown);
    r->StartRead(&r->in_);
    return r.get();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client finished sending (or the call is gone)
      bool close_now = false;
      {
        MutexLock l(&mu_);
        read_done_ = true;
        close_now = !busy_ && !failed_;
      }
      if (!opened_) {
        Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "split stream without SplitOpen"));
      } else if (close_now) {
        Close(grpc::Status::OK);
      }
      return;
    }
    core_->CountSplitUp(WireSize(in_));
    if (!opened_) {
      if (in_.kind_case() != v1::SplitUp::kOpen) {
        Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           "the first split message must be SplitOpen"));
        return;
      }
      auto task = core_->OpenSplit(in_.open(), peer_);
      if (!task.ok()) {
        Close(ToGrpc(task.status()));
        return;
      }
      stream_.emplace(*core_, *task);
      {
        MutexLock l(&mu_);  // OnCancel may read them on another thread
        task_ = *std::move(task);
        opened_ = true;
      }
      v1::SplitDown ready;
      ready.mutable_ready();
      Send(std::move(ready));
      StartRead(&in_);
      return;
    }
    bool schedule = false, read_more = false;
    {
      MutexLock l(&mu_);
      inbox_.push_back(std::move(in_));
      ++outstanding_;
      schedule = !busy_ && !failed_;
      if (schedule) busy_ = true;
      read_more = !failed_ && outstanding_ <= task_.window;
      paused_ = !read_more;
    }
    if (schedule) {
      auto self = self_;
      core_->pool().Submit([self] { self->Drain(); });
    }
    if (read_more) StartRead(&in_);
  }

  void OnCancel() override {
    SplitStreamTask task;
    {
      MutexLock l(&mu_);
      if (!opened_) return;
      task = task_;
    }
    core_->SplitEnded(task, absl::CancelledError("split stream lost"));
  }

  void OnDone() override { self_.reset(); }  // may delete this

 private:
  SplitReactor(Coordinator* core, std::string peer) : core_(core), peer_(std::move(peer)) {}
  void Queued(const v1::SplitDown& msg) override { core_->CountSplitDown(WireSize(msg)); }

  // Runs on the pool: processes queued messages until none is left.
  void Drain() {
    while (true) {
      v1::SplitUp msg;
      bool close = false;
      {
        MutexLock l(&mu_);
        if (inbox_.empty()) {
          busy_ = false;
          close = read_done_;
          if (!close) return;
        } else {
          msg = std::move(inbox_.front());
          inbox_.pop_front();
        }
      }
      if (close) {
        Close(grpc::Status::OK);
        return;
      }
      StatusOr<std::vector<v1::SplitDown>> answers = stream_->Process(std::move(msg));
      const Status s = answers.status();
      if (s.ok()) {
        for (auto& m : *answers) Send(std::move(m));
      }
      bool resume = false;
      {
        MutexLock l(&mu_);
        --outstanding_;
        if (!s.ok()) failed_ = true;
        if (s.ok() && paused_ && outstanding_ <= task_.window) {
          paused_ = false;
          resume = true;
        }
      }
      if (!s.ok()) {
        core_->SplitEnded(task_, s);
        Close(ToGrpc(s));
        return;
      }
      if (resume) StartRead(&in_);
    }
  }

  Coordinator* core_;
  const std::string peer_;
  std::shared_ptr<SplitReactor> self_;
  v1::SplitUp in_;
  bool opened_ = false;   // written under mu_ once, by a reaction
  SplitStreamTask task_;  // fixed when opened_ is set
  // The stream's protocol state, set when opened; used by one Drain at a time.
  std::optional<SplitStream> stream_;
  Mutex mu_;
  std::deque<v1::SplitUp> inbox_ ABSL_GUARDED_BY(mu_);
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------------
// Uplink probe: counts and discards what the client sends.
class ProbeReactor : public grpc::ServerReadReactor<v1::ProbeChunk> {
 public:
  ProbeReactor(Coordinator* core, v1::ProbeReply* reply, std::string peer)
      : core_(core), reply_(reply), peer_(std::move(peer)) {
    core_->CountUp(kCallBytesUp);
    core_->CountDown(kCallBytesDown);
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      reply_->set_bytes(bytes_);
      core_->CountDown(WireSize(*reply_));
      Finish(grpc::Status::OK);
      return;
    }
    core_->CountUp(WireSize(in_));
    if (bytes_ == 0 && !authenticated_) {
      if (Status s = core_->Authenticate(in_.client_id(), in_.session_token(), peer_); !s.ok()) {
        Finish(ToGrpc(s));
        return;
      }
      authenticated_ = true;
    }
    bytes_ += static_cast<int64_t>(in_.data().size());
    if (bytes_ > core_->probe_size()) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "probe larger than probe_size"));
      return;
    }
    StartRead(&in_);
  }

  void OnDone() override { delete this; }

 private:
  Coordinator* core_;
  v1::ProbeReply* reply_;
  const std::string peer_;
  v1::ProbeChunk in_;
  int64_t bytes_ = 0;
  bool authenticated_ = false;
};

}  // namespace

// ---------------------------------------------------------------------------------
// The service: checks the bearer token of each call and hands it to its reactor.
// Fetch is a raw method: downloads are written as byte buffers whose data slices point
// into the shared blob (FetchReactor), so no download copies the model.
class RpcService final
    : public v1::Coordinator::WithRawCallbackMethod_Fetch<v1::Coordinator::CallbackService> {
 public:
  RpcService(Coordinator* core, std::string bearer) : core_(core), bearer_(std::move(bearer)) {}

  grpc::ServerBidiReactor<v1::ClientMessage, v1::ServerMessage>* Control(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Fetch(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* req) override;
  grpc::ServerReadReactor<v1::UploadChunk>* Upload(grpc::CallbackServerContext* ctx,
                                                   v1::UploadReply* reply) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const v1::StatusRequest* req,
                                      v1::StatusReply* reply) override;
  grpc::ServerBidiReactor<v1::SplitUp, v1::SplitDown>* Split(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerReadReactor<v1::ProbeChunk>* Probe(grpc::CallbackServerContext* ctx,
                                                 v1::ProbeReply* reply) override;
  grpc::ServerUnaryReactor* SecAgg(grpc::CallbackServerContext* ctx, const v1::SecAggRequest* req,
                                   v1::SecAggReply* reply) override;

 private:
  // auth.token_file: OK when off or when the call carries "authorization: Bearer TOKEN"
  // (compared in constant time); UNAUTHENTICATED otherwise.
  grpc::Status CheckBearer(const grpc::CallbackServerContext* ctx) const;

  Coordinator* const core_;
  const std::string bearer_;  // "Bearer TOKEN" from auth.token_file; empty = no token check
};

grpc::Status RpcService::CheckBearer(const grpc::CallbackServerContext* ctx) const {
  if (bearer_.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no bearer token (auth.token_file)");
  }
  if (!TokenMatches(bearer_, std::string(it->second.data(), it->second.size()))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
  }
  return grpc::Status::OK;
}

grpc::ServerBidiReactor<v1::ClientMessage, v1::ServerMessage>* RpcService::Control(
    grpc::CallbackServerContext* ctx) {
  using R = grpc::ServerBidiReactor<v1::ClientMessage, v1::ServerMessage>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  return ControlReactor::Create(core_, PeerIdentity(ctx));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RpcService::Fetch(grpc::CallbackServerContext* ctx,
                                                                 const grpc::ByteBuffer* req) {
  using R = grpc::ServerWriteReactor<grpc::ByteBuffer>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  v1::FetchRequest request;
  grpc::ByteBuffer bytes(*req);  // Deserialize takes a mutable buffer: a reference copy
  if (!grpc::SerializationTraits<v1::FetchRequest>::Deserialize(&bytes, &request).ok()) {
    return new Refusal<R>(ToGrpc(absl::InvalidArgumentError("malformed FetchRequest")));
  }
  return new FetchReactor(core_, request, PeerIdentity(ctx));
}

grpc::ServerReadReactor<v1::UploadChunk>* RpcService::Upload(grpc::CallbackServerContext* ctx,
                                                               v1::UploadReply* reply) {
  using R = grpc::ServerReadReactor<v1::UploadChunk>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  return UploadReactor::Create(core_, ctx, reply);
}

grpc::ServerBidiReactor<v1::SplitUp, v1::SplitDown>* RpcService::Split(
    grpc::CallbackServerContext* ctx) {
  using R = grpc::ServerBidiReactor<v1::SplitUp, v1::SplitDown>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  return SplitReactor::Create(core_, PeerIdentity(ctx));
}

grpc::ServerReadReactor<v1::ProbeChunk>* RpcService::Probe(grpc::CallbackServerContext* ctx,
                                                             v1::ProbeReply* reply) {
  using R = grpc::ServerReadReactor<v1::ProbeChunk>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  return new ProbeReactor(core_, reply, PeerIdentity(ctx));
}

grpc::ServerUnaryReactor* RpcService::SecAgg(grpc::CallbackServerContext* ctx,
                                               const v1::SecAggRequest* req,
                                               v1::SecAggReply* reply) {
  auto* r = ctx->DefaultReactor();
  if (auto s = CheckBearer(ctx); !s.ok()) {
    r->Finish(s);
    return r;
  }
  core_->CountUp(kCallBytesUp + WireSize(*req));
  core_->CountDown(kCallBytesDown + WireSize(*reply));
  r->Finish(ToGrpc(core_->SecAggSubmit(*req, PeerIdentity(ctx))));
  return r;
}

grpc::ServerUnaryReactor* RpcService::GetStatus(grpc::CallbackServerContext* ctx,
                                                  const v1::StatusRequest* req,
                                                  v1::StatusReply* reply) {
  auto* r = ctx->DefaultReactor();
  if (auto s = CheckBearer(ctx); !s.ok()) {
    r->Finish(s);
    return r;
  }
  core_->FillStatus(reply);
  core_->CountUp(kCallBytesUp + WireSize(*req));
  core_->CountDown(kCallBytesDown + WireSize(*reply));
  r->Finish(grpc::Status::OK);
  return r;
}


// ---------------------------------------------------------------------------------
// The transport: port, limits, TLS.

RpcTransport::RpcTransport(Coordinator* core)
    : core_(core), opts_(core->options()), cfg_(opts_.config) {}

StatusOr<std::unique_ptr<RpcTransport>> RpcTransport::Create(Coordinator* core) {
  std::unique_ptr<RpcTransport> t(new RpcTransport(core));
  const JobConfig& cfg = t->cfg_;
  if (cfg.tls.cert.empty() && !t->opts_.insecure && !t->opts_.in_process_only) {
    return absl::FailedPreconditionError(
        "TLS is required: set tls.cert and tls.key (`cleave certs init DIR` makes them) or "
        "run with --insecure for plaintext");
  }
  if (cfg.tls.mutual && (cfg.tls.cert.empty() || cfg.tls.ca.empty())) {
    return absl::InvalidArgumentError("tls.mutual needs tls.cert, tls.key and tls.ca");
  }
  std::string bearer;
  if (!cfg.auth.token_file.empty() && !t->opts_.in_process_only) {
    ASSIGN_OR_RETURN(std::string token, ReadBearerToken(cfg.auth.token_file));
    if (token.size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "auth.token_file: ", cfg.auth.token_file, " holds ", token.size(),
          " characters; a bearer token needs at least 16"));
    }
    bearer = "Bearer " + token;
  }
  t->service_ = std::make_unique<RpcService>(core, std::move(bearer));
  return t;
}

RpcTransport::~RpcTransport() { Shutdown(); }

void RpcTransport::Shutdown() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
    cv_.SignalAll();
  }
  if (tls_thread_.joinable()) tls_thread_.join();
  // Cancels calls still open after a grace period and waits for every reactor's OnDone,
  // while the coordinator's worker pool can still finish uploads.
  if (grpc_server_) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc_server_.reset();
  }
  if (opts_.run_dir.empty() && !tls_dir_.empty()) {  // a temporary staging directory
    std::error_code ec;
    std::filesystem::remove_all(tls_dir_, ec);
    tls_dir_.clear();
  }
}

std::shared_ptr<grpc::Channel> RpcTransport::InProcessChannel() {
  return grpc_server_->InProcessChannel(grpc::ChannelArguments());
}

StatusOr<std::shared_ptr<grpc::ServerCredentials>> RpcTransport::ServerCredentials() {
  const TlsConfig& t = cfg_.tls;
  if (t.cert.empty()) {
    spdlog::warn("--insecure: TLS is off; clients, their updates and any bearer token travel "
                 "in plaintext");
    return grpc::InsecureServerCredentials();
  }
  // Refuse to serve with material no client could handshake with; then serve a checked
  // copy, which ReloadTlsLoop replaces only by material that passes the same checks.
  ASSIGN_OR_RETURN(tls_material_, ReadServerTls(t.cert, t.key, t.ca));
  if (!t.revoked.empty()) {
    ASSIGN_OR_RETURN(std::set<std::string> revoked, ReadRevocationList(t.revoked));
    core_->Revoke(std::move(revoked));
  }
  if (opts_.run_dir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cleave-tls-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError("cannot create a TLS staging directory");
    }
    tls_dir_ = tmpl;
  } else {
    tls_dir_ = (std::filesystem::path(opts_.run_dir) / "tls").string();
  }
  RETURN_IF_ERROR(StageTls(tls_material_));
  const std::string cur = tls_dir_ + "/current/";
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      cur + "key.pem", cur + "cert.pem", t.ca.empty() ? "" : cur + "ca.pem",
      std::max(1, t.reload_s / 2));
  grpc::experimental::TlsServerCredentialsOptions o(provider);
  o.watch_identity_key_cert_pairs();
  if (!t.ca.empty()) o.watch_root_certs();
  o.set_cert_request_type(t.mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  spdlog::info("TLS on: {}{}", t.cert, t.mutual ? ", client certificates required (mutual TLS)" : "");
  return grpc::experimental::TlsServerCredentials(o);
}

Status RpcTransport::StageTls(const TlsMaterial& m) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(tls_dir_) / absl::StrCat("v", ++tls_version_);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  }
  fs::permissions(tls_dir_, fs::perms::owner_all, ec);
  RETURN_IF_ERROR(WriteFileAtomic((dir / "cert.pem").string(), m.cert_chain));
  RETURN_IF_ERROR(WriteFileAtomic((dir / "key.pem").string(), m.key));
  fs::permissions(dir / "key.pem", fs::perms::owner_read | fs::perms::owner_write, ec);
  if (!m.ca.empty()) RETURN_IF_ERROR(WriteFileAtomic((dir / "ca.pem").string(), m.ca));
  const fs::path link = fs::path(tls_dir_) / "current", tmp = fs::path(tls_dir_) / "current.tmp";
  fs::remove(tmp, ec);
  fs::create_directory_symlink(dir.filename(), tmp, ec);
  if (!ec) fs::rename(tmp, link, ec);  // atomic: the watcher sees the old or the new pair
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot switch ", link.string(), ": ", ec.message()));
  }
  fs::remove_all(fs::path(tls_dir_) / absl::StrCat("v", tls_version_ - 2), ec);
  return absl::OkStatus();
}

void RpcTransport::ReloadTlsLoop() {
  const TlsConfig& t = cfg_.tls;
  while (true) {
    {
      MutexLock l(&mu_);
      const Clock& clock = core_->clock();
      const Clock::time_point next = clock.Now() + Seconds(t.reload_s);
      while (!stopping_ && clock.Now() < next) clock.WaitUntil(cv_, mu_, next);
      if (stopping_) return;
    }
    auto m = ReadServerTls(t.cert, t.key, t.ca);
    if (!m.ok()) {
      spdlog::error("TLS reload: keeping the current certificate and key: {}",
                    std::string(m.status().message()));
    } else if (m->cert_chain != tls_material_.cert_chain || m->key != tls_material_.key ||
               m->ca != tls_material_.ca) {
      if (Status s = StageTls(*m); !s.ok()) {
        spdlog::error("TLS reload: {}", s.ToString());
      } else {
        tls_material_ = *std::move(m);
        spdlog::info("TLS reload: new certificate material from {}", t.cert);
      }
    }
    if (!t.revoked.empty()) {
      auto revoked = ReadRevocationList(t.revoked);
      if (!revoked.ok()) {
        spdlog::error("TLS reload: keeping the current revocation list: {}",
                      std::string(revoked.status().message()));
      } else {
        core_->Revoke(*std::move(revoked));
      }
    }
  }
}

Status RpcTransport::Start() {
  if (opts_.in_process_only) {
    core_->SetMaxSessions(1 << 20);
    grpc::ServerBuilder b;
    b.RegisterService(service_.get());
    grpc_server_ = b.BuildAndStart();
    if (!grpc_server_) return absl::InternalError("cannot start the in-process server");
    spdlog::info("run {} serving in this process only (no port)", core_->RunId());
    return absl::OkStatus();
  }
  const std::string addr = opts_.listen.empty() ? cfg_.server.listen : opts_.listen;
  {
    // Every session holds a connection (a descriptor); keep room for files, threads and
    // connections still handshaking.
    rlimit r{};
    const int64_t fds = getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY
                            ? static_cast<int64_t>(r.rlim_cur)
                            : 1 << 20;
    const int derived = static_cast<int>(std::clamp<int64_t>((fds - 64) / 2, 1, 1 << 20));
    // Connections beyond the cap are closed at accept (accept_gate.h): the rest of the
    // descriptors stay for run files, gRPC's own and the spare.
    const int connections = cfg_.server.max_connections > 0
                                ? cfg_.server.max_connections
                                : static_cast<int>(std::clamp<int64_t>(fds - 128, 16, 1 << 20));
    SetConnectionLimit(connections);
    spdlog::info("up to {} sessions and {} connections ({} descriptors)",
                 core_->SetMaxSessions(derived),
                 connections, fds);
  }
  ASSIGN_OR_RETURN(auto credentials, ServerCredentials());
  grpc::ServerBuilder b;
  b.AddListeningPort(addr, credentials, &port_);
  // Two servers on one port would split the federation between them (gRPC sets
  // SO_REUSEPORT by default): binding a port in use must fail.
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A connection that does not finish its TLS and HTTP/2 handshakes in time is closed,
  // so idle connections cannot pile up before authentication.
  b.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                       static_cast<int>(cfg_.server.handshake_timeout_s * 1000));
  // ... and one that carries no call for a minute (a client keeps its control stream
  // open, so only abandoned connections go).
  b.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 60000);
  b.RegisterService(service_.get());
  // Accept client keepalive pings (clients ping every 20 s while idle).
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Fixed HTTP/2 receive windows of 128 KiB per stream instead of BDP auto-tuning,
  // which grows them to many MiB: a queued upload (see UploadSlots::Claim) then holds at
  // most 128 KiB in gRPC's buffers. Costs upload speed only on long-RTT links
  // (128 KiB per round trip); downloads are governed by the client's window.
  b.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  b.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 128 << 10);
  grpc_server_ = b.BuildAndStart();
  if (!grpc_server_ || port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", addr, ": address in use, or not an address of this machine"));
  }
  if (!cfg_.tls.cert.empty()) tls_thread_ = std::thread([this] { ReloadTlsLoop(); });
  spdlog::info("run {} listening on port {}", core_->RunId(), port_);
  if (!opts_.run_dir.empty()) {
    const std::string host = addr.substr(0, addr.rfind(':'));
    const std::string dial = (host == "0.0.0.0" || host == "[::]") ? "127.0.0.1" : host;
    RETURN_IF_ERROR(WriteFileAtomic((std::filesystem::path(opts_.run_dir) / "server.addr").string(), absl::StrCat(dial, ":", port_, "\n")));
  }
  return absl::OkStatus();
}

}  // namespace cleave
