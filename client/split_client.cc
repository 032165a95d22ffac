#include "client/split_client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/transfer.h"
#include "compression/codec.h"
#include "models/part.h"
#include "proto/split_chunks.h"
#include "proto/train_config.h"

namespace cleave {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A tensor and the codec it travels with (`spec` "" = float32).
struct WireCodec {
  std::string spec;
  std::unique_ptr<Codec> codec;
};

void ToWire(const Activations& a, WireCodec& c, v1::TensorData* t) {
  for (int64_t d : a.shape) t->add_shape(d);
  t->set_codec(c.spec);
  t->set_data(EncodeValues(c.codec.get(), a.values, a.shape));
}

StatusOr<Activations> FromWire(const v1::TensorData& t, const WireCodec& c) {
  Activations a;
  a.shape.assign(t.shape().begin(), t.shape().end());
  int64_t n = 1;
  for (int64_t d : a.shape) {
    if (d <= 0 || n > (int64_t{1} << 31) / d) {
      return absl::DataLossError("the server sent a tensor with a bad shape");
    }
    n *= d;
  }
  if (a.shape.empty() || t.codec() != c.spec) {
    return absl::DataLossError("the server sent a tensor without a shape or in another codec");
  }
  auto values = DecodeValues(c.codec.get(), t.data(), a.shape);
  if (!values.ok()) {
    return absl::DataLossError(absl::StrCat("the server sent a bad tensor: ",
                                            values.status().message()));
  }
  a.values = *std::move(values);
  return a;
}

// Writes queued messages on its own thread, so that sending overlaps computing.
class Writer {
 public:
  Writer(grpc::ClientReaderWriter<v1::SplitUp, v1::SplitDown>* stream, DeviceEmulator* emu)
      : stream_(stream), emu_(emu), thread_([this] { Loop(); }) {}
  ~Writer() { Close(); }

  // Queues `msg`, its tensor in chunks when large (proto/split_chunks.h).
  void Push(v1::SplitUp msg) {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& m : Chunked(std::move(msg))) queue_.push_back(std::move(m));
    cv_.notify_one();
  }
  // Sends what is queued, then half-closes the stream. Returns false if a write failed.
  bool Close() {
    {
      std::lock_guard<std::mutex> l(mu_);
      closing_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
    return ok_;
  }

 private:
  void Loop() {
    while (true) {
      v1::SplitUp msg;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return closing_ || !queue_.empty(); });
        if (queue_.empty()) break;
        msg = std::move(queue_.front());
        queue_.pop_front();
      }
      if (!ok_) continue;  // drain after a failure
      if (emu_) emu_->up.Consume(static_cast<int64_t>(msg.ByteSizeLong()));
      ok_ = stream_->Write(msg);
    }
    if (ok_) stream_->WritesDone();
  }

  grpc::ClientReaderWriter<v1::SplitUp, v1::SplitDown>* stream_;
  DeviceEmulator* emu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::SplitUp> queue_;
  bool closing_ = false;
  std::atomic<bool> ok_{true};
  std::thread thread_;
};

// Loads a part's tensors from the part the server sent and, when there is a base (a
// LoRA model's frozen tensors), the rest from the base; every tensor must come from one.
Status LoadPart(ModelPart& p, const ParameterSet& part, const ParameterSet* base) {
  if (base == nullptr) return p.LoadFrom(part);
  const ParameterSet mine = p.Parameters();
  for (const Tensor& t : mine.tensors()) {
    if (part.Find(t.name) == nullptr && base->Find(t.name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", t.name,
                                                     " is neither in the task's part nor in its base"));
    }
  }
  RETURN_IF_ERROR(p.LoadFrom(*base, /*partial=*/true));
  return p.LoadFrom(part, /*partial=*/true);
}

}  // namespace

LocalTrainOptions TrainOptions(const v1::TrainConfig& tc) {
  return LocalTrainOptions(FitFromProto(tc));
}

StatusOr<SplitTaskResult> RunSplitTask(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                       const v1::Task& task, const ParameterSet& part,
                                       const Dataset& data, const SplitTaskOptions& o) {
  const v1::SplitTask& st = task.split();
  const bool ushaped = st.mode() == "ushaped";
  if (st.cut() < 1 || st.window() < 1 || (ushaped && st.tail_begin() <= st.cut())) {
    return absl::InvalidArgumentError("bad split task");
  }
  // The server checks every micro-batch against the model's shapes: a language model's
  // activations are [B, context, dim].
  if (data.type == ExampleType::kToken && data.shape[0] - 1 != o.model.gpt.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split learning takes sequences of model.gpt.context (", o.model.gpt.context,
        ") tokens; the data's are ", data.shape[0] - 1, " (its context= option)"));
  }
  ASSIGN_OR_RETURN(auto head, ModelPart::Create(o.model, 0, st.cut()));
  RETURN_IF_ERROR(LoadPart(*head, part, o.base));
  std::unique_ptr<ModelPart> tail;
  if (ushaped) {
    ASSIGN_OR_RETURN(tail, ModelPart::Create(o.model, st.tail_begin(), st.num_stages()));
    RETURN_IF_ERROR(LoadPart(*tail, part, o.base));
  }
  const LocalTrainOptions training = TrainOptions(task.train());
  RETURN_IF_ERROR(head->ResetOptimizer(training));
  head->SetNoPeek(st.nopeek());
  if (tail) RETURN_IF_ERROR(tail->ResetOptimizer(training));
  if (!(st.activation_noise() >= 0) || !(st.nopeek() >= 0)) {
    return absl::InvalidArgumentError("bad split privacy settings");
  }
  // Activation noise comes from the OS: the server must not be able to predict it.
  std::mt19937_64 noise_rng((static_cast<uint64_t>(std::random_device{}()) << 32) ^
                            std::random_device{}());
  std::normal_distribution<float> noise(0, static_cast<float>(st.activation_noise()));
  WireCodec acts{st.activation_codec(), nullptr}, grads{st.gradient_codec(), nullptr};
  ASSIGN_OR_RETURN(acts.codec, MakeStatelessCodec(acts.spec, o.seed));
  ASSIGN_OR_RETURN(grads.codec, MakeStatelessCodec(grads.spec, o.seed + 1));

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::time_point(
      std::chrono::milliseconds(task.deadline_unix_ms())));
  auto stream = stub->Split(&ctx);
  {
    v1::SplitUp open;
    auto* op = open.mutable_open();
    op->set_run_id(task.run_id());
    op->set_client_id(w.client_id());
    op->set_session_token(w.session_token());
    op->set_round(task.round());
    op->set_task_id(task.task_id());
    v1::SplitDown ready;
    if (!stream->Write(open) || !stream->Read(&ready) || !ready.has_ready()) {
      return FromGrpc(stream->Finish(), "split stream");
    }
  }

  const auto start = Clock::now();
  double compute = 0, wait = 0, server = 0;
  auto timed = [&](auto&& f) {
    const auto t0 = Clock::now();
    auto r = f();
    const double dt = Since(t0);
    compute += dt;
    if (o.emulator) {
      o.emulator->Compute(dt);
      compute += (o.emulator->slowdown - 1) * dt;
    }
    return r;
  };

  SplitTaskResult result;
  Writer writer(stream.get(), o.emulator);
  bool finished = false;
  // Ends the stream: cancels it unless `status` is OK, and returns the server's status
  // when it has one to tell, else `status`.
  auto finish = [&](Status status) -> Status {
    if (finished) return status;
    finished = true;
    if (!status.ok()) ctx.TryCancel();
    writer.Close();
    Status server = FromGrpc(stream->Finish(), "split stream");
    return !server.ok() && server.code() != absl::StatusCode::kCancelled ? server : status;
  };
  std::map<int64_t, std::vector<int64_t>> inflight;  // seq -> labels
  int64_t seq = 1, steps = 0;
  double loss_sum = 0;
  int64_t loss_n = 0;
  // Reads until one micro-batch completes (its activation gradient arrived and the
  // client part stepped).
  ChunkAssembler<v1::SplitDown> assembler(size_t{4} << 30);
  auto receive = [&]() -> Status {
    while (true) {
      v1::SplitDown piece;
      const auto t0 = Clock::now();
      if (!stream->Read(&piece)) {
        return finish(absl::UnavailableError("split stream: the server ended it early"));
      }
      wait += Since(t0);
      if (o.emulator) o.emulator->down.Consume(static_cast<int64_t>(piece.ByteSizeLong()));
      auto whole = assembler.Add(std::move(piece));
      if (!whole.ok()) return absl::DataLossError(whole.status().message());
      if (!whole->has_value()) continue;  // a tensor in chunks: read on
      v1::SplitDown msg = std::move(**whole);
      if (msg.has_forward()) {  // U-shaped: finish the forward pass and the loss here
        const auto& f = msg.forward();
        server += f.server_seconds();
        auto it = inflight.find(f.seq());
        if (!tail || it == inflight.end()) return absl::DataLossError("unexpected SplitForward");
        ASSIGN_OR_RETURN(Activations act, FromWire(f.activations(), acts));
        ASSIGN_OR_RETURN(ModelPart::LossStep step,
                         timed([&] { return tail->TrainWithLoss(act, it->second); }));
        loss_sum += step.loss * act.batch();
        loss_n += act.batch();
        v1::SplitUp up;
        up.mutable_grad()->set_seq(f.seq());
        ToWire(step.grad_in, grads, up.mutable_grad()->mutable_grad());
        writer.Push(std::move(up));
        continue;
      }
      if (!msg.has_result()) return absl::DataLossError("unexpected message on the split stream");
      const auto& r = msg.result();
      server += r.server_seconds();
      auto it = inflight.find(r.seq());
      if (it == inflight.end()) return absl::DataLossError("gradient for an unknown micro-batch");
      ASSIGN_OR_RETURN(Activations grad, FromWire(r.grad(), grads));
      if (!tail) {
        loss_sum += r.loss() * grad.batch();
        loss_n += grad.batch();
      }
      RETURN_IF_ERROR(timed([&] { return head->Backward(r.seq(), grad).status(); }));
      inflight.erase(it);
      ++steps;
      if (o.crash_after_step && o.crash_after_step(steps)) {
        return absl::AbortedError("simulated crash");
      }
      return absl::OkStatus();
    }
  };

  std::mt19937_64 rng(o.seed);
  std::vector<int64_t> order(data.size);
  std::iota(order.begin(), order.end(), 0);
  const int batch = std::max(1, task.train().batch_size());
  // local_steps > 0: exactly that many micro-batches (epochs as needed), else epochs.
  const int64_t max_steps = task.train().local_steps();
  int64_t sent = 0;
  for (int epoch = 0; max_steps > 0 ? sent < max_steps : epoch < task.train().local_epochs();
       ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    loss_sum = 0;
    loss_n = 0;
    for (int64_t b = 0; b < data.size && (max_steps <= 0 || sent < max_steps); b += batch, ++sent) {
      if (o.cancel && o.cancel->load()) return finish(absl::CancelledError("training cancelled"));
      std::vector<int64_t> idx(order.begin() + b, order.begin() + std::min(data.size, b + batch));
      std::vector<int64_t> labels = BatchLabels(data, idx);
      auto act = timed([&] { return head->Forward(seq, InputBatch(data, idx)); });
      if (!act.ok()) return finish(act.status());
      if (st.activation_noise() > 0) {
        for (float& v : act->values) v += noise(noise_rng);
      }
      v1::SplitUp up;
      auto* mb = up.mutable_batch();
      mb->set_seq(seq);
      ToWire(*act, acts, mb->mutable_activations());
      if (!ushaped) {
        for (int64_t y : labels) mb->add_labels(y);
      }
      writer.Push(std::move(up));
      inflight[seq++] = std::move(labels);
      while (static_cast<int>(inflight.size()) >= st.window()) {
        if (Status s = receive(); !s.ok()) return finish(s);
      }
    }
    while (!inflight.empty()) {
      if (Status s = receive(); !s.ok()) return finish(s);
    }
  }
  writer.Close();
  v1::SplitDown extra;
  if (stream->Read(&extra)) return finish(absl::DataLossError("unexpected message after the last step"));
  RETURN_IF_ERROR(finish(absl::OkStatus()));

  // The trained part, in the layout of the part we were given.
  ParameterSet h = head->Parameters();
  ParameterSet t = tail ? tail->Parameters() : ParameterSet();
  for (const auto& p : part.tensors()) {
    const Tensor* src = h.Find(p.name);
    if (src == nullptr) src = t.Find(p.name);
    if (src == nullptr) return absl::InternalError(absl::StrCat("no trained ", p.name));
    RETURN_IF_ERROR(result.trained.Add(*src));
  }
  result.examples = data.size;
  result.loss = loss_n ? loss_sum / loss_n : 0;
  auto& s = result.stats;
  s.set_steps(steps);
  if (steps > 0) {
    s.set_client_compute_s(compute / steps);
    s.set_server_compute_s(server / steps);
    s.set_transfer_s(std::max(0.0, wait - server) / steps);
    s.set_wall_s(Since(start) / steps);
  }
  return result;
}

StatusOr<v1::Profile> ProfileDevice(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                    const ModelSpec& model, const Dataset& data,
                                    int64_t memory_limit_bytes, DeviceEmulator* emulator) {
  v1::Profile p;
  // Text: a language model reads each sequence but its last token.
  std::vector<int64_t> sample = data.shape;
  if (data.type == ExampleType::kToken) sample = {data.shape[0] - 1};
  ASSIGN_OR_RETURN(std::vector<StageProfile> stages,
                   ProfileStages(model, sample, w.profile_batch_size(), 3));
  const double slowdown = emulator ? emulator->slowdown : 1.0;
  for (const auto& s : stages) p.add_stage_seconds(s.seconds * slowdown);
  p.set_batch_size(w.profile_batch_size());
  p.set_memory_limit_bytes(memory_limit_bytes);
  // Round trip: the fastest of a few status calls.
  double rtt = 1e9;
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    v1::StatusRequest req;
    v1::StatusReply reply;
    const auto t0 = Clock::now();
    if (stub->GetStatus(&ctx, req, &reply).ok()) rtt = std::min(rtt, Since(t0));
  }
  p.set_rtt_s(rtt < 1e9 ? rtt : 0);
  if (!w.probe_digest().empty()) {
    const auto t0 = Clock::now();
    ASSIGN_OR_RETURN(std::string probe,
                     FetchBlob(stub, w.client_id(), w.session_token(), w.probe_digest(), 120, emulator));
    p.set_downlink_bytes_per_s(probe.size() / std::max(1e-6, Since(t0) - p.rtt_s()));
    ASSIGN_OR_RETURN(double up, ProbeUplink(stub, w.client_id(), w.session_token(),
                                            w.probe_size(), emulator));
    p.set_uplink_bytes_per_s(w.probe_size() / std::max(1e-6, up - p.rtt_s()));
  }
  return p;
}

}  // namespace cleave
