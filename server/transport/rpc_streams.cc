// The transport's streams: uploads (UploadReactor), split learning's activation
// streams (SplitReactor) and link probes (ProbeReactor).
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <optional>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "core/printable.h"
#include "proto/split_chunks.h"
#include "server/coordinator.h"
#include "server/transport/rpc_internal.h"
#include "server/transport/split_stream.h"

namespace cleave {
namespace rpc_internal {
namespace {

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
        core_->buffers().Return(std::move(payload_));
        if (!s.ok()) {
          core_->LogRefusedUpload(header_, s);
        } else {
          core_->latency().upload.Observe(
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
      payload_ = core_->buffers().Take(expected_);
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
    payload_ = core_->buffers().Take(expected_);
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

grpc::ServerReadReactor<v1::UploadChunk>* NewUploadReactor(Coordinator* core,
                                                           grpc::CallbackServerContext* ctx,
                                                           v1::UploadReply* reply) {
  return UploadReactor::Create(core, ctx, reply);
}

grpc::ServerBidiReactor<v1::SplitUp, v1::SplitDown>* NewSplitReactor(Coordinator* core,
                                                                     const std::string& peer) {
  return SplitReactor::Create(core, peer);
}

grpc::ServerReadReactor<v1::ProbeChunk>* NewProbeReactor(Coordinator* core, v1::ProbeReply* reply,
                                                         const std::string& peer) {
  return new ProbeReactor(core, reply, peer);
}

}  // namespace rpc_internal
}  // namespace cleave
