#include "client/pipeline_relay.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <future>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/split_wire.h"
#include "client/transfer.h"
#include "core/grpc_status.h"
#include "core/mutex.h"
#include "core/printable.h"

namespace cleave {
namespace {

using SteadyClock = std::chrono::steady_clock;
using UpStream = grpc::ServerReaderWriter<v1::SplitDown, v1::SplitUp>;
using DownStream = grpc::ClientReaderWriter<v1::SplitUp, v1::SplitDown>;

class Relay {
 public:
  Relay(v1::Coordinator::Stub* stub, const v1::Welcome& w, const v1::Task& task, const SplitTaskOptions& o)
      : stub_(stub), w_(w), task_(task), st_(task.split()), o_(o),
        ushaped_(st_.tail_begin() < st_.num_stages()),
        upstream_(absl::StrCat("the chain's previous device ", st_.upstream().name())),
        downstream_(st_.has_downstream() ? absl::StrCat("the chain's next device ", st_.downstream().name())
                                         : std::string("the server")) {}

  Status Prepare(const ParameterSet& part) {
    if (st_.begin() < 1 || st_.cut() <= st_.begin() || st_.micro_batches() < 1 || !st_.has_upstream()) {
      return absl::InvalidArgumentError("bad pipeline task: a relay holds [begin >= 1, cut) and has an upstream");
    }
    ASSIGN_OR_RETURN(part_, ModelPart::Create(o_.model, st_.begin(), st_.cut()));
    RETURN_IF_ERROR(LoadSplitPart(*part_, part, task_, o_));
    RETURN_IF_ERROR(part_->ResetOptimizer(TrainOptions(task_.train())));
    part_->SetAccumulate(st_.micro_batches());
    acts_.spec = st_.activation_codec();
    grads_.spec = st_.gradient_codec();
    ASSIGN_OR_RETURN(acts_.codec, MakeStatelessCodec(acts_.spec, o_.seed));
    ASSIGN_OR_RETURN(grads_.codec, MakeStatelessCodec(grads_.spec, o_.seed + 1));
    return absl::OkStatus();
  }

  // Serves the upstream's call: opens the hop onward, then micro-batches forward on this
  // thread and gradients back on another, until the upstream half-closes and every
  // micro-batch came back. The status goes back upstream.
  grpc::Status Serve(grpc::ServerContext* ctx, UpStream* up) {
    start_ = SteadyClock::now();
    Status s = Run(ctx, up);
    if (!s.ok()) spdlog::warn("round {}: pipeline stages [{}, {}) failed: {}", task_.round(), st_.begin(), st_.cut(), s.ToString());
    MutexLock l(&mu_);
    result_ = s;
    return ToGrpc(s);
  }

  Status result() const {
    MutexLock l(&mu_);
    return result_;
  }

  StatusOr<SplitTaskResult> Result(const ParameterSet& part) const {
    SplitTaskResult r;
    const ParameterSet mine = part_->Parameters();
    for (const auto& p : part.tensors()) {
      const Tensor* t = mine.Find(p.name);
      if (t == nullptr) return absl::InternalError(absl::StrCat("no trained ", p.name));
      RETURN_IF_ERROR(r.trained.Add(*t));
    }
    r.examples = 1;  // the server weights every segment of a chain by its data owner's examples
    r.loss = loss_n_ ? loss_sum_ / loss_n_ : 0;
    auto& s = r.stats;
    s.set_steps(steps_);
    if (steps_ > 0) {
      s.set_client_compute_s(compute_ / steps_);
      s.set_server_compute_s(server_ / steps_);
      s.set_wall_s(wall_ / steps_);
      s.set_transfer_s(std::max(0.0, wall_ - compute_ - server_) / steps_);
    }
    for (const v1::PipelineSpan& x : spans_) *s.add_spans() = x;
    return r;
  }

 private:
  Status Run(grpc::ServerContext* ctx, UpStream* up) {
    // Onward: the next device, or, last in the chain, the server as from a client.
    std::unique_ptr<DownStream> down;
    if (st_.has_downstream()) {
      ASSIGN_OR_RETURN(down, OpenHop(st_.downstream(), o_.peer, task_, &down_ctx_));
    } else {
      ASSIGN_OR_RETURN(down, OpenSplit(stub_, w_, task_, &down_ctx_));
    }
    v1::SplitDown ready;
    ready.mutable_ready();
    if (!up->Write(ready)) {
      down_ctx_.TryCancel();
      down->Finish();
      return absl::UnavailableError(absl::StrCat(upstream_, " left before its hop was ready"));
    }
    Status forward, back;
    {
      StreamWriter<UpStream, v1::SplitDown> up_writer(up, o_.emulator);
      StreamWriter<DownStream, v1::SplitUp> down_writer(down.get(), o_.emulator);
      std::thread backward([&] { back = Back(ctx, down.get(), &up_writer); });
      forward = Forward(ctx, up, &down_writer);
      if (!forward.ok()) {
        {
          MutexLock l(&mu_);
          forward_failed_ = true;  // its status, not a cancellation, goes back upstream
        }
        down_ctx_.TryCancel();
      }
      down_writer.Close();  // the hop onward is half-closed: its end comes back
      backward.join();
      up_writer.Close();    // every gradient is sent before the call returns
    }
    Status onward = FromGrpc(down->Finish(), downstream_);
    wall_ = std::chrono::duration<double>(SteadyClock::now() - start_).count();
    if (!forward.ok()) return forward;
    if (!back.ok()) return back;
    return onward;
  }

  // Upstream's micro-batches: this part's forward pass, the result onward.
  Status Forward(grpc::ServerContext* ctx, UpStream* up, StreamWriter<DownStream, v1::SplitUp>* down) {
    ChunkAssembler<v1::SplitUp> assembler(size_t{1} << 30);
    const int64_t max_batch = std::max(1, task_.train().batch_size());
    v1::SplitUp piece;
    bool partial = false;  // a tensor's chunks are still coming
    while (up->Read(&piece)) {
      if (o_.emulator) o_.emulator->down.Consume(static_cast<int64_t>(piece.ByteSizeLong()));
      if (o_.cancel && o_.cancel->load()) return absl::CancelledError("training cancelled");
      auto whole = assembler.Add(std::move(piece));
      if (!whole.ok()) return absl::InvalidArgumentError(absl::StrCat(upstream_, ": ", whole.status().message()));
      partial = !whole->has_value();
      if (partial) continue;
      v1::SplitUp msg = std::move(**whole);
      if (ushaped_ && msg.has_grad()) {  // the head's gradient, on its way to the server
        {
          MutexLock l(&mu_);
          if (!headed_.erase(msg.grad().seq()) || !head_done_.insert(msg.grad().seq()).second) {
            return absl::InvalidArgumentError(
                absl::StrCat(upstream_, " sent the head's gradient of micro-batch ", msg.grad().seq(), ", which is not due"));
          }
        }
        down->Push(std::move(msg));
        continue;
      }
      if (!msg.has_batch()) return absl::InvalidArgumentError(absl::StrCat(upstream_, " sent something else than a micro-batch"));
      const v1::SplitBatch& b = msg.batch();
      auto act = FromWire(b.activations(), acts_, upstream_);
      if (!act.ok()) return absl::InvalidArgumentError(act.status().message());
      if (act->batch() < 1 || act->batch() > max_batch) {
        return absl::InvalidArgumentError(
            absl::StrCat(upstream_, " sent a micro-batch of ", act->batch(), " samples, expected 1..", max_batch));
      }
      for (float v : act->values) {
        if (!std::isfinite(v)) return absl::InvalidArgumentError(absl::StrCat(upstream_, " sent activations that are not all finite"));
      }
      v1::SplitUp out;
      v1::SplitBatch* next = out.mutable_batch();
      {
        MutexLock l(&mu_);
        if (!back_error_.ok()) return back_error_;
        if (inflight_.count(b.seq())) {
          return absl::InvalidArgumentError(absl::StrCat(upstream_, " sent micro-batch ", b.seq(), " twice"));
        }
        const double t0 = UnixSeconds();
        const auto c0 = SteadyClock::now();
        auto y = part_->Forward(b.seq(), *act);
        Count(c0);
        if (!y.ok()) {
          return absl::InvalidArgumentError(absl::StrCat("micro-batch ", b.seq(), " from ", upstream_, ": ", y.status().message()));
        }
        if (b.batch_end()) {
          ends_.insert(b.seq());
          if (first_end_ == 0) first_end_ = b.seq();
        }
        AddPipelineSpan(&spans_, b.seq(), first_end_, /*forward=*/true, t0);
        inflight_.insert(b.seq());
        next->set_seq(b.seq());
        next->set_loss_weight(b.loss_weight());
        next->set_batch_end(b.batch_end());
        ToWire(*y, acts_, next->mutable_activations());
      }
      *next->mutable_labels() = b.labels();  // the server checks them
      down->Push(std::move(out));
    }
    // The upstream half-closed (its last batch came back), or dropped.
    MutexLock l(&mu_);
    if (ctx->IsCancelled()) return back_error_.ok() ? absl::CancelledError(absl::StrCat(upstream_, " dropped the hop")) : back_error_;
    if (partial) return absl::InvalidArgumentError(absl::StrCat(upstream_, " ended inside a tensor"));
    while (!inflight_.empty() && back_error_.ok()) cv_.Wait(&mu_);
    return back_error_;
  }

  // Gradients from downstream: this part's backward pass, the input's gradient upstream.
  Status Back(grpc::ServerContext* ctx, DownStream* down, StreamWriter<UpStream, v1::SplitDown>* up) {
    Status s = BackLoop(down, up);
    MutexLock l(&mu_);
    if (s.ok() && !inflight_.empty()) s = absl::UnavailableError(absl::StrCat(downstream_, " ended the stream early"));
    if (!s.ok()) {
      back_error_ = s;
      if (!forward_failed_) ctx->TryCancel();  // the upstream's micro-batches have nowhere to go
    }
    cv_.SignalAll();
    return s;
  }

  Status BackLoop(DownStream* down, StreamWriter<UpStream, v1::SplitDown>* up) {
    ChunkAssembler<v1::SplitDown> assembler(size_t{1} << 30);
    v1::SplitDown piece;
    while (down->Read(&piece)) {
      if (o_.emulator) o_.emulator->down.Consume(static_cast<int64_t>(piece.ByteSizeLong()));
      auto whole = assembler.Add(std::move(piece));
      if (!whole.ok()) return absl::DataLossError(absl::StrCat(downstream_, ": ", whole.status().message()));
      if (!whole->has_value()) continue;
      v1::SplitDown msg = std::move(**whole);
      if (ushaped_ && msg.has_forward()) {  // the head's input, on its way to the data owner
        {
          MutexLock l(&mu_);
          const int64_t seq = msg.forward().seq();
          if (!inflight_.count(seq) || head_done_.count(seq) || !headed_.insert(seq).second) {
            return absl::DataLossError(absl::StrCat(downstream_, " sent the head's input of micro-batch ", seq,
                                                    ", which is not due"));
          }
        }
        up->Push(std::move(msg));
        continue;
      }
      if (!msg.has_result()) return absl::DataLossError(absl::StrCat(downstream_, " sent something else than a gradient"));
      const v1::SplitResult& r = msg.result();
      ASSIGN_OR_RETURN(Activations grad, FromWire(r.grad(), grads_, downstream_));
      for (float v : grad.values) {
        if (!std::isfinite(v)) return absl::DataLossError(absl::StrCat(downstream_, " sent gradients that are not all finite"));
      }
      if (!std::isfinite(r.loss()) || !std::isfinite(r.server_seconds()) || r.server_seconds() < 0) {
        return absl::DataLossError(absl::StrCat(downstream_, " sent a loss or time that is not a number"));
      }
      v1::SplitDown out;
      v1::SplitResult* back = out.mutable_result();
      {
        MutexLock l(&mu_);
        if (!inflight_.count(r.seq()) || (ushaped_ && !head_done_.erase(r.seq()))) {
          return absl::DataLossError(absl::StrCat(downstream_, " sent a gradient for an unknown micro-batch"));
        }
        const double t0 = UnixSeconds();
        const auto c0 = SteadyClock::now();
        auto g = part_->Backward(r.seq(), grad);
        if (!g.ok()) return g.status();
        if (ends_.erase(r.seq())) RETURN_IF_ERROR(part_->Step());  // the batch's last
        Count(c0);
        AddPipelineSpan(&spans_, r.seq(), first_end_, /*forward=*/false, t0);
        inflight_.erase(r.seq());
        ++steps_;
        loss_sum_ += r.loss() * grad.batch();
        loss_n_ += grad.batch();
        server_ += r.server_seconds();
        back->set_seq(r.seq());
        back->set_loss(r.loss());
        back->set_server_seconds(r.server_seconds());
        ToWire(*g, grads_, back->mutable_grad());
        cv_.SignalAll();
      }
      up->Push(std::move(out));
      if (o_.crash_after_step && o_.crash_after_step(steps_)) return absl::AbortedError("simulated crash");
    }
    return absl::OkStatus();
  }

  // Compute since `t0`, scaled by the emulated slowdown (which it also idles for).
  void Count(SteadyClock::time_point t0) {
    const double dt = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    compute_ += dt;
    if (o_.emulator) {
      o_.emulator->Compute(dt);
      compute_ += (o_.emulator->slowdown - 1) * dt;
    }
  }

  v1::Coordinator::Stub* stub_;
  const v1::Welcome& w_;
  const v1::Task& task_;
  const v1::SplitTask& st_;
  const SplitTaskOptions& o_;
  // U-shaped: the head's input passes through, back to the data owner, and its gradient
  // back up, as they came (the owner and the server check them).
  const bool ushaped_;
  const std::string upstream_, downstream_;  // who they are, for errors
  std::unique_ptr<ModelPart> part_;
  WireCodec acts_, grads_;
  grpc::ClientContext down_ctx_;
  SteadyClock::time_point start_;

  // Shared by the forward (the call's) thread and the backward one.
  mutable Mutex mu_;
  CondVar cv_;
  std::set<int64_t> inflight_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> headed_ ABSL_GUARDED_BY(mu_);     // U-shaped: passed up to the head, its gradient due
  std::set<int64_t> head_done_ ABSL_GUARDED_BY(mu_);  // and its gradient passed on: the result is due
  Status back_error_ ABSL_GUARDED_BY(mu_);
  Status result_ ABSL_GUARDED_BY(mu_) = absl::UnknownError("the hop never opened");
  bool forward_failed_ ABSL_GUARDED_BY(mu_) = false;
  // micro-batches that end their batch: a step after their backward pass
  std::set<int64_t> ends_ ABSL_GUARDED_BY(mu_);
  int64_t first_end_ ABSL_GUARDED_BY(mu_) = 0;  // the first batch's last micro-batch (0: not seen yet)
  // Written under mu_ by both threads; Result reads them once both ended.
  int64_t steps_ = 0;
  double loss_sum_ = 0;
  int64_t loss_n_ = 0;
  double compute_ = 0, server_ = 0, wall_ = 0;
  std::vector<v1::PipelineSpan> spans_;
};

}  // namespace

StatusOr<SplitTaskResult> RunPipelineRelay(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                           const v1::Task& task, const ParameterSet& part,
                                           const SplitTaskOptions& options, PeerServer* peer) {
  if (peer == nullptr) {
    return absl::FailedPreconditionError(
        "a pipeline task past the data owner needs this device's Peer service (cleave-client --peer-listen)");
  }
  Relay relay(stub, w, task, options);
  RETURN_IF_ERROR(relay.Prepare(part));
  std::promise<void> served;
  std::future<void> done = served.get_future();
  const v1::PipelineHop& upstream = task.split().upstream();
  peer->ExpectPipeline(task.run_id(), task.round(), upstream.name(), upstream.token(),
                       [&relay, &served](grpc::ServerContext* ctx, UpStream* up, const v1::PipelineOpen&) {
                         grpc::Status s = relay.Serve(ctx, up);
                         served.set_value();
                         return s;
                       });
  const auto deadline = std::chrono::system_clock::time_point(std::chrono::milliseconds(task.deadline_unix_ms()));
  // Until the upstream's call comes, its Peer port (when it serves one) is probed once a
  // second: three failures in a row (its process is gone) end the wait, as in gossip.
  auto next_probe = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  int strikes = 0;
  while (done.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    const bool gone = strikes >= 3;
    if (gone || (options.cancel && options.cancel->load()) || std::chrono::system_clock::now() >= deadline) {
      if (!peer->EndPipeline()) {
        return gone ? absl::UnavailableError(absl::StrCat("the chain's previous device ", Printable(upstream.name()),
                                                          " cannot be reached at ", Printable(upstream.address())))
                    : absl::DeadlineExceededError(absl::StrCat("the chain's previous device ",
                                                               Printable(upstream.name()), " never opened its hop"));
      }
      done.wait();  // it runs: its streams end by the task's deadline
      break;
    }
    if (!upstream.address().empty() && !peer->PipelineTaken() && std::chrono::steady_clock::now() >= next_probe) {
      const PeerLink& l = options.peer;
      strikes = PeerReachable(upstream.address(), upstream.name(), l.ca, l.cert, l.key, 1.0) ? 0 : strikes + 1;
      next_probe = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    }
  }
  peer->EndPipeline();
  RETURN_IF_ERROR(relay.result());
  return relay.Result(part);
}

}  // namespace cleave
