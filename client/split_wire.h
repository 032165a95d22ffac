// What the client's split streams share: tensors on the wire in a codec, and a writer
// thread that sends queued messages (in chunks) while the caller computes. Used by the
// split task (client/split_client.cc) and by a pipeline's relay (client/pipeline_relay.cc)
// on both of its streams.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "cleave/v1/cleave.grpc.pb.h"
#include "client/emulation.h"
#include "client/split_client.h"
#include "compression/codec.h"
#include "core/mutex.h"
#include "core/status.h"
#include "models/part.h"
#include "proto/split_chunks.h"

namespace cleave {

// A tensor and the codec it travels with (`spec` "" = float32).
struct WireCodec {
  std::string spec;
  std::unique_ptr<Codec> codec;
};

void ToWire(const Activations& a, WireCodec& c, v1::TensorData* t);
// DATA_LOSS naming `from` (who sent it) for a tensor without a good shape, in another
// codec, or that does not decode.
StatusOr<Activations> FromWire(const v1::TensorData& t, const WireCodec& c, const std::string& from);

// Half-closes a stream this side opened; the side that serves one ends it by returning.
inline void HalfClose(grpc::ClientReaderWriter<v1::SplitUp, v1::SplitDown>* s) { s->WritesDone(); }
inline void HalfClose(grpc::ServerReaderWriter<v1::SplitDown, v1::SplitUp>*) {}

// Writes queued messages on its own thread, so that sending overlaps computing; each
// message's bytes go through the emulated uplink (when there is one) first.
template <typename Stream, typename Message>
class StreamWriter {
 public:
  StreamWriter(Stream* stream, DeviceEmulator* emu) : stream_(stream), emu_(emu), thread_([this] { Loop(); }) {}
  ~StreamWriter() { Close(); }

  // Queues `msg`, its tensor in chunks when large (proto/split_chunks.h).
  void Push(Message msg) {
    MutexLock l(&mu_);
    for (auto& m : Chunked(std::move(msg))) queue_.push_back(std::move(m));
    cv_.Signal();
  }
  // Sends what is queued, then half-closes the stream. Returns false if a write failed.
  bool Close() {
    {
      MutexLock l(&mu_);
      closing_ = true;
      cv_.Signal();
    }
    if (thread_.joinable()) thread_.join();
    return ok_;
  }

 private:
  void Loop() {
    while (true) {
      Message msg;
      {
        MutexLock l(&mu_);
        while (!closing_ && queue_.empty()) cv_.Wait(&mu_);
        if (queue_.empty()) break;
        msg = std::move(queue_.front());
        queue_.pop_front();
      }
      if (!ok_) continue;  // drain after a failure
      if (emu_) emu_->up.Consume(static_cast<int64_t>(msg.ByteSizeLong()));
      ok_ = stream_->Write(msg);
    }
    if (ok_) HalfClose(stream_);
  }

  Stream* stream_;
  DeviceEmulator* emu_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Message> queue_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> ok_{true};
  std::thread thread_;
};

// A pipeline's link to its next device (split.mode: pipeline): Peer.Pipeline on the
// device `hop` names, opened with the hop's secret; the neighbour must present the certificate of hop.name() under TLS (`link.ca` set).
// Waits for the neighbour's SplitReady (it sends one once its own link onward is up).
// `ctx` (its deadline: the task's) must outlive the stream.
StatusOr<std::unique_ptr<grpc::ClientReaderWriter<v1::SplitUp, v1::SplitDown>>> OpenHop(
    const v1::PipelineHop& hop, const PeerLink& link, const v1::Task& task, grpc::ClientContext* ctx);

// The split stream of `task` to the server, opened with this session's SplitOpen; waits
// for the server's SplitReady. `ctx` (its deadline set here: the task's) must outlive it.
StatusOr<std::unique_ptr<grpc::ClientReaderWriter<v1::SplitUp, v1::SplitDown>>> OpenSplit(
    v1::Coordinator::Stub* stub, const v1::Welcome& w, const v1::Task& task, grpc::ClientContext* ctx);

// Wall-clock seconds since the Unix epoch, for PipelineSpan.
double UnixSeconds();

// Pipelines: the forward or backward pass of micro-batch `seq` (1, 2, ...) that began at
// `start_s` (UnixSeconds) and ends now, added to `spans` when it is of the first batch
// (seq <= first_end, the first batch's last micro-batch; 0 while not known) and fewer
// than 64 are there (SplitStats.spans).
void AddPipelineSpan(std::vector<v1::PipelineSpan>* spans, int64_t seq, int64_t first_end, bool forward,
                     double start_s);

}  // namespace cleave
