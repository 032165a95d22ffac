#include "client/split_client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/split_wire.h"
#include "client/transfer.h"
#include "compression/codec.h"
#include "models/part.h"
#include "privacy/certs.h"
#include "privacy/label_dp.h"
#include "privacy/tls.h"
#include "proto/split_chunks.h"
#include "proto/train_config.h"
#include "split/names.h"
#include "split/pipeline_schedule.h"
#include "split/record.h"

namespace cleave {

void ToWire(const Activations& a, WireCodec& c, v1::TensorData* t) {
  for (int64_t d : a.shape) t->add_shape(d);
  t->set_codec(c.spec);
  t->set_data(EncodeValues(c.codec.get(), a.values, a.shape));
}

StatusOr<Activations> FromWire(const v1::TensorData& t, const WireCodec& c, const std::string& from) {
  Activations a;
  a.shape.assign(t.shape().begin(), t.shape().end());
  int64_t n = 1;
  for (int64_t d : a.shape) {
    if (d <= 0 || n > (int64_t{1} << 31) / d) {
      return absl::DataLossError(absl::StrCat(from, " sent a tensor with a bad shape"));
    }
    n *= d;
  }
  if (a.shape.empty() || t.codec() != c.spec) {
    return absl::DataLossError(absl::StrCat(from, " sent a tensor without a shape or in another codec"));
  }
  auto values = DecodeValues(c.codec.get(), t.data(), a.shape);
  if (!values.ok()) {
    return absl::DataLossError(absl::StrCat(from, " sent a bad tensor: ", values.status().message()));
  }
  a.values = *std::move(values);
  return a;
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void AddPipelineSpan(std::vector<v1::PipelineSpan>* spans, int64_t seq, int64_t first_end, bool forward,
                     double start_s) {
  if ((first_end > 0 && seq > first_end) || spans->size() >= 64) return;
  v1::PipelineSpan& x = spans->emplace_back();
  x.set_micro_batch(static_cast<int>(seq - 1));
  x.set_forward(forward);
  x.set_start_s(start_s);
  x.set_end_s(UnixSeconds());
}

StatusOr<std::unique_ptr<grpc::ClientReaderWriter<v1::SplitUp, v1::SplitDown>>> OpenHop(
    const v1::PipelineHop& hop, const PeerLink& link, const v1::Task& task, grpc::ClientContext* ctx) {
  grpc::ChannelArguments args;
  // The neighbour's certificate names it (certs.h); the address is whatever reaches it.
  if (!link.ca.empty()) args.SetSslTargetNameOverride(hop.name() + kPeerNameSuffix);
  args.SetMaxReceiveMessageSize(4 << 20);
  auto channel = grpc::CreateCustomChannel(hop.address(), ClientCredentials(link.ca, link.cert, link.key), args);
  auto stub = v1::Peer::NewStub(channel);
  ctx->set_deadline(std::chrono::system_clock::time_point(std::chrono::milliseconds(task.deadline_unix_ms())));
  auto stream = stub->Pipeline(ctx);
  v1::SplitUp open;
  v1::PipelineOpen* o = open.mutable_hop();
  o->set_run_id(task.run_id());
  o->set_round(task.round());
  o->set_sender(link.name);
  o->set_token(hop.token());
  v1::SplitDown ready;
  if (!stream->Write(open) || !stream->Read(&ready) || !ready.has_ready()) {
    return FromGrpc(stream->Finish(), absl::StrCat("pipeline hop to ", hop.name()));
  }
  return stream;
}

StatusOr<std::unique_ptr<grpc::ClientReaderWriter<v1::SplitUp, v1::SplitDown>>> OpenSplit(
    v1::Coordinator::Stub* stub, const v1::Welcome& w, const v1::Task& task, grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::time_point(std::chrono::milliseconds(task.deadline_unix_ms())));
  auto stream = stub->Split(ctx);
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
  return stream;
}

namespace {

using SteadyClock = std::chrono::steady_clock;

double Since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

using Writer = StreamWriter<grpc::ClientReaderWriter<v1::SplitUp, v1::SplitDown>, v1::SplitUp>;

// Loads a part's tensors from the part the server sent and, when there is a base (a
// LoRA model's frozen tensors), the rest from the base; every tensor must come from one.
// A quantized base's weights come from `quantized` (shared, not copied).
Status LoadPart(ModelPart& p, const ParameterSet& part, const ParameterSet* base,
                const QuantizedSet* quantized) {
  if (quantized != nullptr) RETURN_IF_ERROR(p.LoadQuantized(*quantized));
  if (base == nullptr) return p.LoadFrom(part);
  for (const std::string& name : p.TensorNames()) {
    if (part.Find(name) == nullptr && base->Find(name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", name,
                                                     " is neither in the task's part nor in its base"));
    }
  }
  RETURN_IF_ERROR(p.LoadBase(*base));
  return p.LoadFrom(part, /*partial=*/true);
}

}  // namespace

Status LoadPartFromFolder(ModelPart& p, const ParameterSet& part, const std::string& dir,
                          const std::string& base_digest, const QuantizedSet* quantized) {
  for (const std::string& name : p.TensorNames()) {
    if (name.find(".lora_") != std::string::npos && part.Find(name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("adapter ", name, " is not in the task's part"));
    }
  }
  if (quantized != nullptr) RETURN_IF_ERROR(p.LoadQuantized(*quantized));
  RETURN_IF_ERROR(p.LoadHfFolder(dir));
  const std::string digest = EncodedSha256Hex(p.FrozenViews());
  if (digest != base_digest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--model-dir ", dir, " does not hold the server's model: the frozen weights of stages [", p.begin(), ", ", p.end(),
        ") read from it have digest ", digest.substr(0, 12), ", the server's ", base_digest.substr(0, 12)));
  }
  return p.LoadFrom(part, /*partial=*/true);
}

Status LoadSplitPart(ModelPart& p, const ParameterSet& part, const v1::Task& task, const SplitTaskOptions& o) {
  if (o.model_dir.empty()) return LoadPart(p, part, o.base, o.quantized);
  return LoadPartFromFolder(p, part, o.model_dir, task.base_digest(), o.quantized);
}

LocalTrainOptions TrainOptions(const v1::TrainConfig& tc) {
  return LocalTrainOptions(FitFromProto(tc));
}

namespace {

// One split task on the client: its part(s) of the model, the split stream, and what
// it measured. Prepare, Open, Train, then Result.
class SplitTaskRun {
 public:
  SplitTaskRun(const v1::Task& task, const Dataset& data, const SplitTaskOptions& o)
      : task_(task), st_(task.split()), data_(data), o_(o),
        ushaped_(st_.mode() == SplitModeName(SplitMode::kUShaped) ||
                 (st_.mode() == SplitModeName(SplitMode::kPipeline) && st_.tail_begin() < st_.num_stages())),
        pipeline_(st_.mode() == SplitModeName(SplitMode::kPipeline)), hop_(pipeline_ && st_.has_downstream()),
        peer_(hop_ ? absl::StrCat("the chain's next device ", st_.downstream().name()) : "the server"),
        sent_(o.sent_path, o.keep_sent), guard_(o.guard) {}

  // Checks the task, builds the client part(s) from `part` (and the base) with their
  // optimizers, and the codecs.
  Status Prepare(const ParameterSet& part);
  // Opens the split stream and waits for the server's Ready.
  Status Open(v1::Coordinator::Stub* stub, const v1::Welcome& w);
  // Streams the local epochs (or steps) of micro-batches, split.window in flight, and
  // ends the stream.
  Status Train();
  // The same with the caller's stages (SplitTaskOptions::external): its batches.
  Status TrainExternal();
  // A pipeline's data owner: each batch as micro_batches micro-batches (window in
  // flight), one step per batch once all came back.
  Status TrainPipeline();
  // The trained part in the layout of `part` it was given, its loss and step times.
  StatusOr<SplitTaskResult> Result(const ParameterSet& part) const;

 private:
  // Runs `f`, counting its time (scaled by the emulated slowdown) as client compute.
  template <typename F>
  auto Timed(F&& f) {
    const auto t0 = SteadyClock::now();
    auto r = f();
    const double dt = Since(t0);
    compute_ += dt;
    if (o_.emulator) {
      o_.emulator->Compute(dt);
      compute_ += (o_.emulator->slowdown - 1) * dt;
    }
    return r;
  }
  // Ends the stream: cancels it unless `status` is OK, and returns the server's status
  // when it has one to tell, else `status`.
  Status Finish(Status status);
  // The activation noise and the activation and gradient codecs of the task.
  Status PrepareCodecs();
  // Sends micro-batch `idx` (its activations, and its labels unless U-shaped). Text:
  // `length` > 0 cuts its sequences there. A pipeline's: its share of the batch's loss
  // and whether it ends the batch.
  Status SendBatch(const std::vector<int64_t>& idx, int64_t length = 0, double share = 0, bool batch_end = false);
  // Sends a micro-batch's activations (noised, encoded) and labels, as SendBatch does.
  void Push(Activations act, std::vector<int64_t> labels, double share, bool batch_end);
  // A pipeline's batch `idx` as micro-batches: micro_batches equal ones, or by the token
  // budget (PackByTokens); text micro-batches end after their last target. Sequences
  // without a target are left out (they add nothing to the loss).
  struct MicroBatch {
    std::vector<int64_t> idx;
    int64_t length = 0;  // text: tokens read per sequence
    double share = 0;    // of the batch's loss: its targets over the batch's
  };
  std::vector<MicroBatch> MicroBatches(const std::vector<int64_t>& idx) const;
  // Reads until one micro-batch completes (its activation gradient arrived and the
  // client part stepped).
  Status Receive();
  // U-shaped: the server's activations of micro-batch `f.seq()`: the tail's forward
  // pass, the loss and its gradient back.
  Status Forward(const v1::SplitForward& f);

  const v1::Task& task_;
  const v1::SplitTask& st_;
  const Dataset& data_;
  const SplitTaskOptions& o_;
  const bool ushaped_, pipeline_;
  const bool hop_;          // the stream goes to the chain's next device, not to the server
  const std::string peer_;  // who the stream goes to, for errors
  SplitRecorder sent_;      // --keep-sent: this device's own copy of what it sent
  SplitGuard* const guard_;  // --split-guard's, or nullptr
  std::unique_ptr<ModelPart> head_, tail_;
  std::vector<v1::PipelineSpan> spans_;  // pipeline: the first batch's passes
  // Activation noise comes from the OS: the server must not be able to predict it.
  std::mt19937_64 noise_rng_{(static_cast<uint64_t>(std::random_device{}()) << 32) ^
                             std::random_device{}()};
  std::normal_distribution<float> noise_;
  WireCodec acts_, grads_;

  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::SplitUp, v1::SplitDown>> stream_;
  std::unique_ptr<Writer> writer_;
  bool finished_ = false;
  ChunkAssembler<v1::SplitDown> assembler_{size_t{4} << 30};
  struct InFlight {
    std::vector<int64_t> labels;
    double share = 0;  // U-shaped: of the batch's loss, for the head
    bool fake = false;  // SplitGuard's: its labels moved; the part does not step on it
  };
  std::map<int64_t, InFlight> inflight_;  // by seq
  int64_t first_end_ = 0;  // a pipeline's first batch's last micro-batch (for its spans)
  std::set<int64_t> headed_;  // U-shaped: micro-batches through the head, their gradient due
  int64_t seq_ = 1, steps_ = 0;
  int64_t external_examples_ = 0;  // SplitTaskOptions::external: per epoch, as its begin said
  double loss_sum_ = 0;  // of the last epoch
  int64_t loss_n_ = 0;
  SteadyClock::time_point start_;
  double compute_ = 0, wait_ = 0, server_ = 0;  // seconds, summed over steps
};

Status SplitTaskRun::Prepare(const ParameterSet& part) {
  if (st_.cut() < 1 || st_.window() < 1 || (ushaped_ && st_.tail_begin() <= st_.cut())) {
    return absl::InvalidArgumentError("bad split task");
  }
  if (pipeline_ && (st_.begin() != 0 || st_.micro_batches() < 1 ||
                    std::max(1, task_.train().batch_size()) % st_.micro_batches() != 0)) {
    return absl::InvalidArgumentError("bad pipeline task: its owner holds stage 0 and micro-batches divide the batch");
  }
  if (guard_ && (ushaped_ || pipeline_ || o_.external != nullptr)) {
    return absl::FailedPreconditionError(
        "--split-guard checks the server's gradients against the labels this device sends: U-shaped, pipeline "
        "and external-stage tasks send none to the server");
  }
  if (o_.external != nullptr) {  // the caller's stages: it loads the part
    if (ushaped_ || pipeline_ || o_.own != nullptr || o_.base != nullptr || o_.quantized != nullptr) {
      return absl::FailedPreconditionError(
          "a device whose stages are its own code takes sl, sfl-v1 and sfl-v2 tasks of a model without frozen or "
          "private tensors");
    }
    ASSIGN_OR_RETURN(external_examples_, o_.external->begin(task_, part));
    if (external_examples_ <= 0) return absl::InvalidArgumentError("begin returned no examples");
    return PrepareCodecs();
  }
  // The server checks every micro-batch against the model's shapes: a language model's
  // activations are [B, context, dim].
  if (data_.type == ExampleType::kToken && data_.shape[0] - 1 != o_.model.gpt.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split learning takes sequences of model.gpt.context (", o_.model.gpt.context,
        ") tokens; the data's are ", data_.shape[0] - 1, " (its context= option)"));
  }
  ASSIGN_OR_RETURN(head_, ModelPart::Create(o_.model, 0, st_.cut()));
  if (ushaped_ && !o_.model_dir.empty()) {
    return absl::InvalidArgumentError("a U-shaped task's part is not read from --model-dir");
  }
  if (o_.own != nullptr) {  // the device's own stages: the server sent none of them (U-shaped: the tail alone)
    if (pipeline_ || (!ushaped_ && part.size() != 0)) {
      return absl::InvalidArgumentError("a device's own stages take a cut with nothing of them sent");
    }
    ASSIGN_OR_RETURN(const ParameterSet own, o_.own(head_->Parameters()));
    RETURN_IF_ERROR(head_->LoadFrom(own));
  } else {
    RETURN_IF_ERROR(LoadSplitPart(*head_, part, task_, o_));
  }
  if (ushaped_) {
    ASSIGN_OR_RETURN(tail_, ModelPart::Create(o_.model, st_.tail_begin(), st_.num_stages()));
    RETURN_IF_ERROR(LoadPart(*tail_, part, o_.base, o_.quantized));
  }
  const LocalTrainOptions training = TrainOptions(task_.train());
  RETURN_IF_ERROR(head_->ResetOptimizer(training));
  head_->SetNoPeek(st_.nopeek());
  if (tail_) RETURN_IF_ERROR(tail_->ResetOptimizer(training));
  if (pipeline_) {
    head_->SetAccumulate(st_.micro_batches());
    if (tail_) tail_->SetAccumulate(st_.micro_batches());
  }
  return PrepareCodecs();
}

Status SplitTaskRun::PrepareCodecs() {
  const auto finite = [](double v) { return std::isfinite(v) && v >= 0; };
  if (!finite(st_.activation_noise()) || !finite(st_.nopeek()) || !(st_.label_epsilon() >= 0 && st_.label_epsilon() <= 50)) {
    return absl::InvalidArgumentError("bad split privacy settings (activation noise, NoPeek, label epsilon)");
  }
  noise_ = std::normal_distribution<float>(0, static_cast<float>(st_.activation_noise()));
  acts_.spec = st_.activation_codec();
  grads_.spec = st_.gradient_codec();
  ASSIGN_OR_RETURN(acts_.codec, MakeStatelessCodec(acts_.spec, o_.seed));
  ASSIGN_OR_RETURN(grads_.codec, MakeStatelessCodec(grads_.spec, o_.seed + 1));
  return absl::OkStatus();
}

Status SplitTaskRun::Open(v1::Coordinator::Stub* stub, const v1::Welcome& w) {
  if (hop_) {  // a pipeline's data owner streams to the chain's next device
    ASSIGN_OR_RETURN(stream_, OpenHop(st_.downstream(), o_.peer, task_, &ctx_));
  } else {
    ASSIGN_OR_RETURN(stream_, OpenSplit(stub, w, task_, &ctx_));
  }
  start_ = SteadyClock::now();
  writer_ = std::make_unique<Writer>(stream_.get(), o_.emulator);
  return absl::OkStatus();
}

Status SplitTaskRun::Finish(Status status) {
  if (finished_) return status;
  finished_ = true;
  if (!status.ok()) ctx_.TryCancel();
  writer_->Close();
  Status server = FromGrpc(stream_->Finish(), hop_ ? peer_ : "split stream");
  return !server.ok() && server.code() != absl::StatusCode::kCancelled ? server : status;
}

Status SplitTaskRun::Forward(const v1::SplitForward& f) {
  server_ += f.server_seconds();
  auto it = inflight_.find(f.seq());
  if (!tail_ || it == inflight_.end() || headed_.count(f.seq())) {
    return absl::DataLossError(absl::StrCat(peer_, " sent an unexpected SplitForward"));
  }
  ASSIGN_OR_RETURN(Activations act, FromWire(f.activations(), acts_, peer_));
  for (float v : act.values) {  // a pipeline's relay is a peer, not the server
    if (!std::isfinite(v)) return absl::DataLossError(absl::StrCat(peer_, " sent activations that are not all finite"));
  }
  headed_.insert(f.seq());
  ASSIGN_OR_RETURN(ModelPart::LossStep step,
                   Timed([&] { return tail_->TrainWithLoss(act, it->second.labels, -1, it->second.share); }));
  loss_sum_ += step.loss * act.batch();
  loss_n_ += act.batch();
  v1::SplitUp up;
  up.mutable_grad()->set_seq(f.seq());
  ToWire(step.grad_in, grads_, up.mutable_grad()->mutable_grad());
  writer_->Push(std::move(up));
  return absl::OkStatus();
}

Status SplitTaskRun::Receive() {
  while (true) {
    v1::SplitDown piece;
    const auto t0 = SteadyClock::now();
    if (!stream_->Read(&piece)) {
      return absl::UnavailableError(absl::StrCat("split stream: ", peer_, " ended it early"));
    }
    wait_ += Since(t0);
    if (o_.emulator) o_.emulator->down.Consume(static_cast<int64_t>(piece.ByteSizeLong()));
    auto whole = assembler_.Add(std::move(piece));
    if (!whole.ok()) return absl::DataLossError(whole.status().message());
    if (!whole->has_value()) continue;  // a tensor in chunks: read on
    v1::SplitDown msg = std::move(**whole);
    if (msg.has_forward()) {  // U-shaped: finish the forward pass and the loss here
      RETURN_IF_ERROR(Forward(msg.forward()));
      continue;
    }
    if (!msg.has_result()) return absl::DataLossError("unexpected message on the split stream");
    const auto& r = msg.result();
    server_ += r.server_seconds();
    auto it = inflight_.find(r.seq());
    if (it == inflight_.end() || (tail_ && !headed_.erase(r.seq()))) {
      return absl::DataLossError(absl::StrCat(peer_, " sent a gradient for an unknown micro-batch"));
    }
    ASSIGN_OR_RETURN(Activations grad, FromWire(r.grad(), grads_, peer_));
    const bool fake = it->second.fake;
    if (!tail_ && !fake) {
      loss_sum_ += r.loss() * grad.batch();
      loss_n_ += grad.batch();
    }
    const double began = UnixSeconds();
    if (o_.external != nullptr) {
      RETURN_IF_ERROR(Timed([&] { return o_.external->backward(r.seq(), grad); }));
    } else if (guard_) {  // a fake's gradient is scored, never stepped on
      ASSIGN_OR_RETURN(ModelPart::Probe probe, Timed([&] { return head_->BackwardProbe(r.seq(), grad, !fake); }));
      RETURN_IF_ERROR(guard_->Add(fake, probe.first_gradient));
    } else {
      RETURN_IF_ERROR(Timed([&] { return head_->Backward(r.seq(), grad).status(); }));
    }
    if (pipeline_) AddPipelineSpan(&spans_, r.seq(), first_end_, /*forward=*/false, began);
    inflight_.erase(it);
    ++steps_;
    if (o_.crash_after_step && o_.crash_after_step(steps_)) {
      return absl::AbortedError("simulated crash");
    }
    return absl::OkStatus();
  }
}

Status SplitTaskRun::SendBatch(const std::vector<int64_t>& idx, int64_t length, double share, bool batch_end) {
  std::vector<int64_t> labels = BatchLabels(data_, idx, length);
  const double t0 = UnixSeconds();
  Activations in = InputBatch(data_, idx, length);
  auto act = Timed([&] { return head_->Forward(seq_, in); });
  if (!act.ok()) return act.status();
  sent_.Add({}, st_.cut(), RecordedBatch{Tensor{"", std::move(in.shape), std::move(in.values)}, labels, {}, {}});
  if (pipeline_) AddPipelineSpan(&spans_, seq_, first_end_, /*forward=*/true, t0);
  Push(*std::move(act), std::move(labels), share, batch_end);
  return absl::OkStatus();
}

void SplitTaskRun::Push(Activations act, std::vector<int64_t> labels, double share, bool batch_end) {
  const int64_t classes = o_.model.text() ? o_.model.gpt.vocab : o_.model.num_classes;
  if (st_.label_epsilon() > 0) {  // label DP: the labels sent, or the head's own (U-shaped)
    RandomizeLabels(st_.label_epsilon(), classes, noise_rng_, &labels);
  }
  const bool fake = guard_ && guard_->NextIsFake();
  if (fake) guard_->Fake(classes, &labels);
  if (st_.activation_noise() > 0) {
    for (float& v : act.values) v += noise_(noise_rng_);
  }
  v1::SplitUp up;
  auto* mb = up.mutable_batch();
  mb->set_seq(seq_);
  ToWire(act, acts_, mb->mutable_activations());
  if (!ushaped_) {
    for (int64_t y : labels) mb->add_labels(y);
  }
  mb->set_loss_weight(share);
  mb->set_batch_end(batch_end);
  writer_->Push(std::move(up));
  inflight_[seq_++] = {std::move(labels), share, fake};
}

std::vector<SplitTaskRun::MicroBatch> SplitTaskRun::MicroBatches(const std::vector<int64_t>& idx) const {
  const bool text = data_.type == ExampleType::kToken;
  // Text: a sequence is read up to its last target (0: it has none).
  std::vector<int64_t> ends(idx.size(), 0);
  if (text) {
    for (size_t i = 0; i < idx.size(); ++i) {
      for (int64_t p = data_.example_elements() - 1; p >= 1 && ends[i] == 0; --p) {
        if (data_.target(idx[i], p) != kNoTarget) ends[i] = p;
      }
    }
  }
  std::vector<std::vector<int>> groups;
  if (st_.micro_batch_tokens() > 0 && text) {
    std::vector<int> kept;
    std::vector<int64_t> lengths;
    for (size_t i = 0; i < idx.size(); ++i) {
      if (ends[i] > 0) kept.push_back(static_cast<int>(i)), lengths.push_back(ends[i]);
    }
    for (const std::vector<int>& g : PackByTokens(lengths, st_.micro_batch_tokens())) {
      auto& out = groups.emplace_back();
      for (int j : g) out.push_back(kept[j]);
    }
  } else {
    const int m = st_.micro_batches(), micro = static_cast<int>(idx.size()) / m;
    for (int i = 0; i < m; ++i) {
      auto& out = groups.emplace_back();
      for (int j = i * micro; j < (i + 1) * micro; ++j) out.push_back(j);
    }
  }
  std::vector<MicroBatch> out;
  double total = 0;
  for (const std::vector<int>& g : groups) {
    MicroBatch& mb = out.emplace_back();
    double targets = 0;
    for (int j : g) {
      mb.idx.push_back(idx[j]);
      mb.length = std::max(mb.length, ends[j]);
      if (!text) {
        targets += 1;
        continue;
      }
      for (int64_t p = 1; p <= ends[j]; ++p) targets += data_.target(idx[j], p) != kNoTarget;
    }
    mb.share = targets;
    total += targets;
  }
  for (MicroBatch& mb : out) mb.share = total > 0 ? mb.share / total : 0;
  return out;
}

Status SplitTaskRun::TrainPipeline() {
  std::mt19937_64 rng(o_.seed);
  std::vector<int64_t> order(data_.size);
  std::iota(order.begin(), order.end(), 0);
  const int batch = std::max(1, task_.train().batch_size());
  if (data_.size < batch) {
    return Finish(absl::FailedPreconditionError(
        absl::StrCat(data_.size, " examples: a pipeline trains whole batches of ", batch)));
  }
  // local_steps > 0: exactly that many batches (epochs as needed), else epochs; an
  // epoch's last, smaller batch is dropped (a batch is train.batch_size examples).
  const int64_t max_steps = task_.train().local_steps();
  int64_t batches = 0;
  for (int epoch = 0; max_steps > 0 ? batches < max_steps : epoch < task_.train().local_epochs(); ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    loss_sum_ = 0;
    loss_n_ = 0;
    for (int64_t b = 0; b + batch <= data_.size && (max_steps <= 0 || batches < max_steps); b += batch, ++batches) {
      const std::vector<MicroBatch> micro = MicroBatches({order.begin() + b, order.begin() + b + batch});
      if (micro.empty()) continue;  // no sequence of the batch has a target
      if (first_end_ == 0) first_end_ = seq_ + static_cast<int64_t>(micro.size()) - 1;
      for (size_t i = 0; i < micro.size(); ++i) {
        if (o_.cancel && o_.cancel->load()) return Finish(absl::CancelledError("training cancelled"));
        const MicroBatch& mb = micro[i];
        if (Status s = SendBatch(mb.idx, mb.length, mb.share, i + 1 == micro.size()); !s.ok()) return Finish(s);
        while (static_cast<int>(inflight_.size()) >= st_.window()) {
          if (Status s = Receive(); !s.ok()) return Finish(s);
        }
      }
      while (!inflight_.empty()) {  // the batch's gradients, all of them, before its step
        if (Status s = Receive(); !s.ok()) return Finish(s);
      }
      if (Status s = Timed([&] { return head_->Step(); }); !s.ok()) return Finish(s);
      if (tail_) {
        if (Status s = Timed([&] { return tail_->Step(); }); !s.ok()) return Finish(s);
      }
    }
  }
  writer_->Close();
  v1::SplitDown extra;
  if (stream_->Read(&extra)) return Finish(absl::DataLossError("unexpected message after the last step"));
  return Finish(absl::OkStatus());
}

Status SplitTaskRun::TrainExternal() {
  const int64_t max_steps = task_.train().local_steps();
  int64_t sent = 0;
  for (int epoch = 0; max_steps > 0 ? sent < max_steps : epoch < task_.train().local_epochs(); ++epoch) {
    loss_sum_ = 0;
    loss_n_ = 0;
    int64_t batches = 0;
    while (max_steps <= 0 || sent < max_steps) {
      if (o_.cancel && o_.cancel->load()) return Finish(absl::CancelledError("training cancelled"));
      auto batch = Timed([&] { return o_.external->forward(seq_); });
      if (!batch.ok()) return Finish(batch.status());
      if (!batch->has_value()) break;  // the epoch ended
      ExternalSplit::Batch& b = **batch;
      if (b.activations.batch() < 1 || static_cast<int64_t>(b.labels.size()) != b.activations.batch()) {
        return Finish(absl::InvalidArgumentError(absl::StrCat("forward gave ", b.activations.batch(), " activations and ",
                                                              b.labels.size(), " labels")));
      }
      Push(std::move(b.activations), std::move(b.labels), 0, false);
      ++sent;
      ++batches;
      while (static_cast<int>(inflight_.size()) >= st_.window()) {
        if (Status s = Receive(); !s.ok()) return Finish(s);
      }
    }
    if (batches == 0) return Finish(absl::InvalidArgumentError("forward gave no batch in an epoch"));
    while (!inflight_.empty()) {
      if (Status s = Receive(); !s.ok()) return Finish(s);
    }
  }
  writer_->Close();
  v1::SplitDown extra;
  if (stream_->Read(&extra)) return Finish(absl::DataLossError("unexpected message after the last step"));
  return Finish(absl::OkStatus());
}

Status SplitTaskRun::Train() {
  if (o_.external != nullptr) return TrainExternal();
  if (pipeline_) return TrainPipeline();
  std::mt19937_64 rng(o_.seed);
  std::vector<int64_t> order(data_.size);
  std::iota(order.begin(), order.end(), 0);
  const int batch = std::max(1, task_.train().batch_size());
  // local_steps > 0: exactly that many micro-batches (epochs as needed), else epochs.
  const int64_t max_steps = task_.train().local_steps();
  int64_t sent = 0;
  for (int epoch = 0; max_steps > 0 ? sent < max_steps : epoch < task_.train().local_epochs();
       ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    loss_sum_ = 0;
    loss_n_ = 0;
    for (int64_t b = 0; b < data_.size && (max_steps <= 0 || sent < max_steps);
         b += batch, ++sent) {
      if (o_.cancel && o_.cancel->load()) return Finish(absl::CancelledError("training cancelled"));
      std::vector<int64_t> idx(order.begin() + b, order.begin() + std::min(data_.size, b + batch));
      if (Status s = SendBatch(idx); !s.ok()) return Finish(s);
      while (static_cast<int>(inflight_.size()) >= st_.window()) {
        if (Status s = Receive(); !s.ok()) return Finish(s);
      }
    }
    while (!inflight_.empty()) {
      if (Status s = Receive(); !s.ok()) return Finish(s);
    }
  }
  writer_->Close();
  v1::SplitDown extra;
  if (stream_->Read(&extra)) {
    return Finish(absl::DataLossError("unexpected message after the last step"));
  }
  return Finish(absl::OkStatus());
}

StatusOr<SplitTaskResult> SplitTaskRun::Result(const ParameterSet& part) const {
  SplitTaskResult result;
  if (o_.external != nullptr) {  // the caller's trained part, checked against the one it was given
    ASSIGN_OR_RETURN(result.trained, o_.external->parameters());
    if (result.trained.size() == part.size()) {  // the caller's tensors are the part's, in order
      for (size_t i = 0; i < part.size(); ++i) result.trained.mutable_tensors()[i].name = part.tensors()[i].name;
    }
    if (Status s = CheckViews(part, ViewsOf(result.trained)); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("the trained part is not the part it was given: ", s.message()));
    }
  } else {  // the trained part, in the layout of the part we were given
    ParameterSet h = head_->Parameters();
    ParameterSet t = tail_ ? tail_->Parameters() : ParameterSet();
    for (const auto& p : part.tensors()) {
      const Tensor* src = h.Find(p.name);
      if (src == nullptr) src = t.Find(p.name);
      if (src == nullptr) return absl::InternalError(absl::StrCat("no trained ", p.name));
      RETURN_IF_ERROR(result.trained.Add(*src));
    }
    if (o_.own != nullptr) result.own = std::move(h);
  }
  result.examples = o_.external ? external_examples_ : data_.size;
  result.loss = loss_n_ ? loss_sum_ / loss_n_ : 0;
  auto& s = result.stats;
  s.set_steps(steps_);
  if (steps_ > 0) {
    s.set_client_compute_s(compute_ / steps_);
    s.set_server_compute_s(server_ / steps_);
    s.set_transfer_s(std::max(0.0, wait_ - server_) / steps_);
    s.set_wall_s(Since(start_) / steps_);
  }
  for (const v1::PipelineSpan& x : spans_) *s.add_spans() = x;
  return result;
}

}  // namespace

StatusOr<SplitTaskResult> RunSplitTask(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                       const v1::Task& task, const ParameterSet& part,
                                       const Dataset& data, const SplitTaskOptions& o) {
  SplitTaskRun run(task, data, o);
  RETURN_IF_ERROR(run.Prepare(part));
  RETURN_IF_ERROR(run.Open(stub, w));
  RETURN_IF_ERROR(run.Train());
  return run.Result(part);
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
    const auto t0 = SteadyClock::now();
    if (stub->GetStatus(&ctx, req, &reply).ok()) rtt = std::min(rtt, Since(t0));
  }
  p.set_rtt_s(rtt < 1e9 ? rtt : 0);
  if (!w.probe_digest().empty()) {
    const auto t0 = SteadyClock::now();
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
