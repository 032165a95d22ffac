#include "server/transport/split_stream.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "models/inversion.h"
#include "models/part.h"

namespace cleave {

SplitStream::SplitStream(Coordinator& core, SplitStreamTask task)
    : core_(core),
      task_(std::move(task)),
      // The specs were checked when the server started.
      act_codec_(MakeStatelessCodec(task_.act_codec, 1).value()),
      grad_codec_(MakeStatelessCodec(task_.grad_codec, 2).value()),
      assembler_(static_cast<size_t>(4 * task_.max_elements)),
      recorder_(task_.record_path, task_.record) {}

void SplitStream::Record(Tensor activations, std::vector<int64_t> labels, const Activations& gradient) {
  ParameterSet part;
  int cut = 0;
  if (recorder_.empty()) {  // the part this client was sent, and its cut, with its first micro-batch
    StatusOr<ParameterSet> p = task_.round->ClientPart(task_.client_id);
    if (p.ok()) part = *std::move(p);
    cut = task_.round->CutOf(task_.client_id).value_or(0);
  }
  Tensor reconstruction;
  if (const auto& hijack = task_.round->options().hijack) {  // what the hijack reads of this micro-batch
    StatusOr<Activations> r = hijack->Reconstruct(Activations{activations.shape, activations.values});
    if (r.ok()) reconstruction = Tensor{"", r->shape, std::move(r->values)};
  }
  recorder_.Add(part, cut, RecordedBatch{std::move(activations), std::move(labels), Tensor{"", gradient.shape, gradient.values},
                                         std::move(reconstruction)});
}

StatusOr<std::vector<v1::SplitDown>> SplitStream::Process(v1::SplitUp in) {
  ASSIGN_OR_RETURN(std::optional<v1::SplitUp> whole, assembler_.Add(std::move(in)));
  if (!whole) return std::vector<v1::SplitDown>{};
  const v1::SplitUp& msg = *whole;
  SplitRound& round = *task_.round;
  const auto t0 = std::chrono::steady_clock::now();  // compute time, not a deadline
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  v1::SplitDown out;
  if (msg.kind_case() == v1::SplitUp::kBatch) {
    const v1::SplitBatch& b = msg.batch();
    if (b.seq() != next_seq_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "micro-batch ", b.seq(), " arrived, expected ", next_seq_, " (replayed or out of order)"));
    }
    ASSIGN_OR_RETURN(Activations act, FromWire(b.activations(), task_.act_codec, act_codec_.get()));
    RETURN_IF_ERROR(round.CheckActivations(task_.client_id, act));
    std::vector<int64_t> labels(b.labels().begin(), b.labels().end());
    RETURN_IF_ERROR(round.CheckLabels(act, labels));
    if (!(b.loss_weight() >= 0 && b.loss_weight() <= 1)) {
      return absl::InvalidArgumentError("a micro-batch's loss_weight must be in [0, 1]");
    }
    core_.CountLabels(static_cast<int64_t>(labels.size()));
    ++next_seq_;
    if (recorder_.wants() && round.ushaped()) recording_[b.seq()] = Tensor{"", act.shape, act.values};
    if (round.ushaped()) {
      ASSIGN_OR_RETURN(Activations mid, round.ForwardMiddle(task_.client_id, b.seq(), act));
      pending_[b.seq()] = b.batch_end();
      auto* f = out.mutable_forward();
      f->set_seq(b.seq());
      ToWire(mid, task_.act_codec, act_codec_.get(), f->mutable_activations());
      f->set_server_seconds(seconds());
    } else {
      ASSIGN_OR_RETURN(ModelPart::LossStep step,
                       round.TrainStep(task_.client_id, act, labels, {b.loss_weight(), b.batch_end()}));
      if (recorder_.wants()) Record(Tensor{"", act.shape, act.values}, labels, step.grad_in);
      auto* r = out.mutable_result();
      r->set_seq(b.seq());
      ToWire(step.grad_in, task_.grad_codec, grad_codec_.get(), r->mutable_grad());
      r->set_loss(step.loss);
      r->set_server_seconds(seconds());
    }
  } else if (msg.kind_case() == v1::SplitUp::kGrad) {
    const v1::SplitGrad& g = msg.grad();
    if (!round.ushaped()) {
      return absl::InvalidArgumentError("SplitGrad is only sent in U-shaped split learning");
    }
    if (!pending_.count(g.seq())) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient for micro-batch ", g.seq(), ", which is not pending"));
    }
    ASSIGN_OR_RETURN(Activations grad, FromWire(g.grad(), task_.grad_codec, grad_codec_.get()));
    ASSIGN_OR_RETURN(Activations gin, round.BackwardMiddle(task_.client_id, g.seq(), grad, pending_.at(g.seq())));
    if (auto rec = recording_.find(g.seq()); rec != recording_.end()) {  // U-shaped: the gradient received, checked
      Record(std::move(rec->second), {}, grad);
      recording_.erase(rec);
    }
    pending_.erase(g.seq());
    auto* r = out.mutable_result();
    r->set_seq(g.seq());
    ToWire(gin, task_.grad_codec, grad_codec_.get(), r->mutable_grad());
    r->set_server_seconds(seconds());
  } else {
    return absl::InvalidArgumentError("unexpected message on a split stream");
  }
  return Chunked(std::move(out));
}

StatusOr<Activations> SplitStream::FromWire(const v1::TensorData& t, const std::string& spec,
                                            const Codec* codec) const {
  if (t.codec() != spec) {
    return absl::InvalidArgumentError(absl::StrCat("tensor encoded as '", t.codec(),
                                                   "', the task set '", spec, "'"));
  }
  int64_t n = 1;
  for (int64_t d : t.shape()) {
    if (d <= 0 || n > task_.max_elements / d) {
      return absl::InvalidArgumentError("tensor shape has a non-positive or oversized dimension");
    }
    n *= d;
  }
  if (t.shape().empty()) return absl::InvalidArgumentError("tensor without a shape");
  Activations a;
  a.shape.assign(t.shape().begin(), t.shape().end());
  auto values = DecodeValues(codec, t.data(), a.shape);
  if (!values.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor data does not match its shape: ", values.status().message()));
  }
  a.values = *std::move(values);
  core_.SavedUp(4 * n - static_cast<int64_t>(t.data().size()));
  return a;
}

void SplitStream::ToWire(const Activations& a, const std::string& spec, Codec* codec,
                         v1::TensorData* t) const {
  for (int64_t d : a.shape) t->add_shape(d);
  t->set_codec(spec);
  t->set_data(EncodeValues(codec, a.values, a.shape));
  core_.SavedDown(4 * static_cast<int64_t>(a.values.size()) -
                  static_cast<int64_t>(t->data().size()));
}

}  // namespace cleave
