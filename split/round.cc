#include "split/round.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/inversion.h"
#include "split/names.h"

namespace cleave {

namespace {

// Pending micro-batches of every client share the middle part: key them by client too.
int64_t PendingId(const std::string& client, int64_t seq) {
  return static_cast<int64_t>(std::hash<std::string>{}(client) << 24) ^ seq;
}

}  // namespace

struct SplitRound::ClientState {
  int begin = 0, cut = 0;
  bool streams = true;              // it sends the server micro-batches (pipeline: the last device)
  std::unique_ptr<ModelPart> copy;  // sfl-v1: this client's server copy; pipeline: its chain's
  bool finished = false, failed = false;
  int64_t weight = 0;
  ParameterSet part;  // the finished client's trained part
};

template <typename F>
auto SplitRound::Timed(F&& step) -> decltype(step()) {
  using Clock = std::chrono::steady_clock;  // compute time measured, not a deadline
  const auto t0 = Clock::now();
  auto result = step();
  const auto t1 = Clock::now();
  busy_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
  const int64_t end = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - created_).count();
  int64_t last = last_end_ns_.load();
  while (end > last && !last_end_ns_.compare_exchange_weak(last, end)) {
  }
  return result;
}

SplitRound::Load SplitRound::ServerLoad() const {
  return {busy_ns_ * 1e-9, last_end_ns_ * 1e-9};
}

SplitRound::SplitRound(SplitRoundOptions options, ParameterSet global, std::vector<int> stage_of)
    : opts_(std::move(options)), global_(std::move(global)), stage_of_(std::move(stage_of)) {}
SplitRound::~SplitRound() = default;

StatusOr<std::unique_ptr<SplitRound>> SplitRound::Empty(SplitRoundOptions options,
                                                        const ParameterSet& global) {
  ASSIGN_OR_RETURN(std::vector<int> stage_of, ParameterStages(options.model));
  if (stage_of.size() != global.size()) {
    return absl::InvalidArgumentError("the global model does not match the model's stages");
  }
  std::unique_ptr<SplitRound> r(new SplitRound(std::move(options), global, std::move(stage_of)));
  r->min_cut_ = r->opts_.tail_begin;
  r->current_ = global;
  return r;
}

Status SplitRound::AddClient(const std::string& id, int begin, int cut, bool copy) {
  const int server_end = opts_.tail_begin;
  if (begin < 0 || cut <= begin || cut >= server_end) {
    return absl::InvalidArgumentError(absl::StrCat("stages [", begin, ", ", cut, ") for ", id,
                                                   " are not a segment before stage ", server_end));
  }
  if (clients_.count(id)) return absl::InvalidArgumentError(absl::StrCat(id, " holds two segments"));
  auto c = std::make_unique<ClientState>();
  c->begin = begin;
  c->cut = cut;
  c->streams = copy || opts_.mode != SplitMode::kPipeline;
  if (copy) {
    ASSIGN_OR_RETURN(c->copy, ModelPart::Create(opts_.model, cut, server_end));
    RETURN_IF_ERROR(c->copy->LoadFrom(global_));
    if (!opts_.quantized.empty()) RETURN_IF_ERROR(c->copy->LoadQuantized(opts_.quantized));
    RETURN_IF_ERROR(c->copy->ResetOptimizer(opts_.training));
    if (opts_.mode == SplitMode::kPipeline) c->copy->SetAccumulate(opts_.micro_batches);
  }
  if (c->streams) min_cut_ = std::min(min_cut_, cut);
  clients_[id] = std::move(c);
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<SplitRound>> SplitRound::Create(SplitRoundOptions options,
                                                         const ParameterSet& global,
                                                         const std::map<std::string, int>& cuts) {
  if (cuts.empty()) return absl::InvalidArgumentError("a split round needs clients");
  if (options.mode == SplitMode::kPipeline) return absl::InvalidArgumentError("a pipeline round has chains");
  ASSIGN_OR_RETURN(std::unique_ptr<SplitRound> r, Empty(std::move(options), global));
  const auto& o = r->opts_;
  for (const auto& [id, cut] : cuts) {
    if (cut < 1) return absl::InvalidArgumentError(absl::StrCat("cut ", cut, " for ", id, " is not >= 1"));
    if (o.hijack && cut != o.hijack->cut()) {
      return absl::InvalidArgumentError(absl::StrCat("cut ", cut, " for ", id, ": the hijack is at cut ", o.hijack->cut()));
    }
    RETURN_IF_ERROR(r->AddClient(id, 0, cut, o.mode == SplitMode::kSflV1));
  }
  if (o.mode != SplitMode::kSflV1) {
    ASSIGN_OR_RETURN(r->shared_, ModelPart::Create(o.model, r->min_cut_, o.tail_begin));
    RETURN_IF_ERROR(r->shared_->LoadFrom(global));
    if (!o.quantized.empty()) RETURN_IF_ERROR(r->shared_->LoadQuantized(o.quantized));
    RETURN_IF_ERROR(r->shared_->ResetOptimizer(o.training));
  }
  return r;
}

StatusOr<std::unique_ptr<SplitRound>> SplitRound::CreatePipeline(SplitRoundOptions options,
                                                                 const ParameterSet& global,
                                                                 const std::vector<SplitChain>& chains) {
  if (chains.empty()) return absl::InvalidArgumentError("a pipeline round needs chains");
  if (options.mode != SplitMode::kPipeline || options.micro_batches < 1) {
    return absl::InvalidArgumentError("a pipeline round needs mode pipeline and micro_batches >= 1");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SplitRound> r, Empty(std::move(options), global));
  for (const SplitChain& chain : chains) {
    if (chain.devices.empty() || chain.bounds.size() != chain.devices.size() + 1 || chain.bounds[0] != 0) {
      return absl::InvalidArgumentError("a chain's bounds start at 0 with one more than its devices");
    }
    for (size_t i = 0; i < chain.devices.size(); ++i) {
      RETURN_IF_ERROR(r->AddClient(chain.devices[i], chain.bounds[i], chain.bounds[i + 1],
                                   /*copy=*/i + 1 == chain.devices.size()));
    }
  }
  return r;
}

StatusOr<SplitRound::ClientState*> SplitRound::Find(const std::string& client) const {
  auto it = clients_.find(client);
  if (it == clients_.end()) {
    return absl::NotFoundError(absl::StrCat("client ", client, " has no split task this round"));
  }
  return it->second.get();
}

StatusOr<int> SplitRound::CutOf(const std::string& client) const {
  std::lock_guard<std::mutex> l(mu_);
  ASSIGN_OR_RETURN(ClientState * c, Find(client));
  return c->cut;
}

StatusOr<int> SplitRound::BeginOf(const std::string& client) const {
  std::lock_guard<std::mutex> l(mu_);
  ASSIGN_OR_RETURN(ClientState * c, Find(client));
  return c->begin;
}

StatusOr<int> SplitRound::StageOf(const std::string& name) const {
  for (size_t i = 0; i < global_.size(); ++i) {
    if (global_.tensors()[i].name == name) return stage_of_[i];
  }
  return absl::NotFoundError(absl::StrCat("no tensor ", name, " in the model"));
}

bool SplitRound::ClientHolds(const ClientState& c, int stage) const {
  // The head (U-shaped) is the data owner's: the client that holds stage 0.
  return (stage >= c.begin && stage < c.cut) || (c.begin == 0 && stage >= opts_.tail_begin);
}

bool SplitRound::ushaped() const {
  return opts_.mode == SplitMode::kUShaped || (opts_.mode == SplitMode::kPipeline && opts_.tail_begin < opts_.num_stages);
}

StatusOr<ParameterSet> SplitRound::ClientPart(const std::string& client) const {
  std::lock_guard<std::mutex> l(mu_);
  ASSIGN_OR_RETURN(ClientState * c, Find(client));
  ParameterSet source = current_;
  if (opts_.mode == SplitMode::kSl) {
    // The shared part holds the latest values of the stages it covers.
    std::lock_guard<std::mutex> sl(shared_mu_);
    ParameterSet server = shared_->Parameters();
    for (auto& t : source.mutable_tensors()) {
      if (const Tensor* s = server.Find(t.name)) t.values = s->values;
    }
  }
  ParameterSet part;
  for (size_t i = 0; i < source.size(); ++i) {
    const Tensor& t = source.tensors()[i];
    const auto& own = opts_.private_names;
    if (ClientHolds(*c, stage_of_[i]) && std::find(own.begin(), own.end(), t.name) == own.end()) {
      RETURN_IF_ERROR(part.Add(t));
    }
  }
  return part;
}

Status SplitRound::CheckActivations(const std::string& client, const Activations& a) const {
  int cut;
  {
    std::lock_guard<std::mutex> l(mu_);
    ASSIGN_OR_RETURN(ClientState * c, Find(client));
    cut = c->cut;
  }
  const auto& sample = opts_.stage_input_shapes[cut];
  std::vector<int64_t> expected = {a.batch()};
  expected.insert(expected.end(), sample.begin(), sample.end());
  // Text: a micro-batch may be cut after its longest sequence's last target (a causal
  // model's outputs before it are the same).
  if (opts_.model.text() && a.shape.size() == expected.size() && expected.size() >= 2 && a.shape[1] >= 1 &&
      a.shape[1] <= expected[1]) {
    expected[1] = a.shape[1];
  }
  if (a.shape != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activations shaped [", absl::StrJoin(a.shape, ","), "], expected [B,",
        absl::StrJoin(sample, ","), "] at cut ", cut));
  }
  if (a.batch() < 1 || a.batch() > opts_.max_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batch of ", a.batch(), " samples, expected 1..", opts_.max_batch));
  }
  if (static_cast<int64_t>(a.values.size()) != NumElements(a.shape)) {
    return absl::InvalidArgumentError("activation values do not match their shape");
  }
  for (float v : a.values) {
    if (!std::isfinite(v)) return absl::InvalidArgumentError("activations are not all finite");
  }
  return absl::OkStatus();
}

Status SplitRound::CheckLabels(const Activations& a, const std::vector<int64_t>& labels) const {
  if (ushaped()) {
    if (!labels.empty()) {
      return absl::InvalidArgumentError("labels must not be sent in U-shaped split learning");
    }
    return absl::OkStatus();
  }
  // A language model's output is [T, vocab] per sample: a label for each token.
  const auto& out = opts_.stage_input_shapes.back();
  const int64_t per_sample = out.size() == 2 ? (a.shape.size() >= 2 ? a.shape[1] : out[0]) : 1;
  if (static_cast<int64_t>(labels.size()) != a.batch() * per_sample) {
    return absl::InvalidArgumentError(absl::StrCat(labels.size(), " labels for ", a.batch(),
                                                   " samples", per_sample > 1
                                                       ? absl::StrCat(" of ", per_sample, " tokens")
                                                       : ""));
  }
  // Text: a token that is read but not predicted (an instruction's prompt) has label
  // kNoTarget; a micro-batch needs one to predict (a loss over none is not a number).
  bool any = false;
  for (int64_t y : labels) {
    if (per_sample > 1 && y == kNoTarget) continue;
    if (y < 0 || y >= opts_.num_classes) {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", y, " is not in [0, ", opts_.num_classes, ")"));
    }
    any = true;
  }
  if (!any) return absl::InvalidArgumentError("a micro-batch with no token to predict");
  return absl::OkStatus();
}

StatusOr<ModelPart::LossStep> SplitRound::TrainStep(const std::string& client,
                                                    const Activations& a,
                                                    const std::vector<int64_t>& labels,
                                                    const SplitMicroBatch& mb) {
  if (ushaped()) return absl::FailedPreconditionError("U-shaped rounds take ForwardMiddle/BackwardMiddle");
  ClientState* c;
  {
    std::lock_guard<std::mutex> l(mu_);
    ASSIGN_OR_RETURN(c, Find(client));
    if (c->finished || c->failed) return absl::FailedPreconditionError("the task is over");
    if (!c->streams) {
      return absl::FailedPreconditionError(absl::StrCat(
          "client ", client, " holds stages [", c->begin, ", ", c->cut, ") of a chain: only its last device streams"));
    }
  }
  if (opts_.hijack) {  // red team: the gradient pulls the client part into the attack's feature space
    return Timed([&]() -> StatusOr<ModelPart::LossStep> {
      ASSIGN_OR_RETURN(FeatureSpaceHijack::Step step, opts_.hijack->Train(a));
      return ModelPart::LossStep{step.loss, 0, std::move(step.grad)};
    });
  }
  if (c->copy && opts_.mode == SplitMode::kPipeline) {  // the chain's copy steps once per batch
    return Timed([&]() -> StatusOr<ModelPart::LossStep> {
      ASSIGN_OR_RETURN(ModelPart::LossStep step, c->copy->TrainWithLoss(a, labels, -1, mb.loss_weight));
      if (mb.batch_end) RETURN_IF_ERROR(c->copy->Step());
      return step;
    });
  }
  if (c->copy) return Timed([&] { return c->copy->TrainWithLoss(a, labels); });  // its copy
  std::lock_guard<std::mutex> l(shared_mu_);  // the shared part: one step at a time
  return Timed([&] { return shared_->TrainWithLoss(a, labels, c->cut); });
}


StatusOr<SplitRound::ClientState*> SplitRound::MiddleOf(const std::string& client) const {
  if (!ushaped()) return absl::FailedPreconditionError("only U-shaped rounds have a middle part");
  std::lock_guard<std::mutex> l(mu_);
  ASSIGN_OR_RETURN(ClientState * c, Find(client));
  if (c->finished || c->failed) return absl::FailedPreconditionError("the task is over");
  if (!c->streams) {
    return absl::FailedPreconditionError(absl::StrCat(
        "client ", client, " holds stages [", c->begin, ", ", c->cut, ") of a chain: only its last device streams"));
  }
  return c;
}

StatusOr<Activations> SplitRound::ForwardMiddle(const std::string& client, int64_t seq,
                                                const Activations& a) {
  ASSIGN_OR_RETURN(ClientState * c, MiddleOf(client));
  if (c->copy) return Timed([&] { return c->copy->Forward(seq, a); });  // its chain's copy
  std::lock_guard<std::mutex> l(shared_mu_);
  return Timed([&] { return shared_->Forward(PendingId(client, seq), a, c->cut); });
}

StatusOr<Activations> SplitRound::BackwardMiddle(const std::string& client, int64_t seq,
                                                 const Activations& grad, bool batch_end) {
  for (float v : grad.values) {
    if (!std::isfinite(v)) return absl::InvalidArgumentError("gradients are not all finite");
  }
  ASSIGN_OR_RETURN(ClientState * c, MiddleOf(client));
  if (c->copy) {  // a chain's copy steps once per batch
    return Timed([&]() -> StatusOr<Activations> {
      ASSIGN_OR_RETURN(Activations g, c->copy->Backward(seq, grad));
      if (batch_end) RETURN_IF_ERROR(c->copy->Step());
      return g;
    });
  }
  std::lock_guard<std::mutex> l(shared_mu_);
  return Timed([&] { return shared_->Backward(PendingId(client, seq), grad); });
}

StatusOr<SplitRound::ClientState*> SplitRound::FinishLocked(const std::string& client, int64_t weight) {
  if (weight <= 0) return absl::InvalidArgumentError("a client's weight must be > 0");
  ASSIGN_OR_RETURN(ClientState * c, Find(client));
  if (c->finished || c->failed) return absl::FailedPreconditionError("the task is over");
  c->finished = true;
  c->weight = weight;
  return c;
}

Status SplitRound::Finish(const std::string& client, const ParameterSet& part, int64_t weight) {
  ASSIGN_OR_RETURN(ParameterSet layout, ClientPart(client));
  RETURN_IF_ERROR(layout.CheckSameLayout(part));
  std::lock_guard<std::mutex> l(mu_);
  ASSIGN_OR_RETURN(ClientState * c, FinishLocked(client, weight));
  if (opts_.mode == SplitMode::kSl) {
    // The next client continues from this one's part; the shared part learns the
    // stages it also covers.
    for (const auto& t : part.tensors()) {
      for (auto& g : current_.mutable_tensors()) {
        if (g.name == t.name) g.values = t.values;
      }
    }
    std::lock_guard<std::mutex> sl(shared_mu_);
    RETURN_IF_ERROR(shared_->LoadFrom(part, /*partial=*/true));
  } else {
    c->part = part;
  }
  return absl::OkStatus();
}

Status SplitRound::FinishMasked(const std::string& client, int64_t weight) {
  std::lock_guard<std::mutex> l(mu_);
  return FinishLocked(client, weight).status();
}

void SplitRound::Fail(const std::string& client) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = clients_.find(client);
  if (it == clients_.end() || it->second->finished) return;
  // The copy stays until the round ends: a step on it may still be running.
  it->second->failed = true;
}

int SplitRound::finished() const {
  std::lock_guard<std::mutex> l(mu_);
  int n = 0;
  for (const auto& [id, c] : clients_) n += c->finished;
  return n;
}

StatusOr<ParameterSet> SplitRound::Aggregate(const std::map<std::string, MaskedSum>& masked) {
  std::lock_guard<std::mutex> l(mu_);
  std::lock_guard<std::mutex> sl(shared_mu_);
  ParameterSet next = global_;
  if (opts_.mode == SplitMode::kSl) {
    next = current_;
    ParameterSet server = shared_->Parameters();
    for (auto& t : next.mutable_tensors()) {
      if (const Tensor* s = server.Find(t.name)) t.values = s->values;
    }
    return next;
  }
  const size_t n = global_.size();
  std::vector<std::vector<double>> sum(n);
  std::vector<double> weight(n, 0.0);
  auto add = [&](size_t i, const std::vector<float>& v, double w) {
    if (sum[i].empty()) sum[i].assign(v.size(), 0.0);
    for (size_t j = 0; j < v.size(); ++j) sum[i][j] += w * v[j];
    weight[i] += w;
  };
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < n; ++i) index[global_.tensors()[i].name] = i;
  std::vector<double> shared_weight(n, 0.0);
  for (const auto& [id, c] : clients_) {
    if (!c->finished) continue;
    for (const auto& t : c->part.tensors()) add(index.at(t.name), t.values, c->weight);
    if (c->copy) {
      const ParameterSet server = c->copy->Parameters();
      for (const auto& t : server.tensors()) add(index.at(t.name), t.values, c->weight);
    } else {
      for (size_t i = 0; i < n; ++i) {
        if (!ClientHolds(*c, stage_of_[i])) shared_weight[i] += c->weight;
      }
    }
  }
  for (const auto& [name, m] : masked) {
    auto it = index.find(name);
    if (it == index.end() || m.weighted_delta.size() != global_.tensors()[it->second].values.size()) {
      return absl::InvalidArgumentError(absl::StrCat("a masked sum for ", name, ", which is not the model's"));
    }
    if (m.weight <= 0) continue;
    const size_t i = it->second;
    const auto& start = global_.tensors()[i].values;
    if (sum[i].empty()) sum[i].assign(start.size(), 0.0);
    for (size_t j = 0; j < start.size(); ++j) sum[i][j] += m.weight * start[j] + m.weighted_delta[j];
    weight[i] += m.weight;
  }
  if (shared_) {
    const ParameterSet server = shared_->Parameters();
    for (const auto& t : server.tensors()) {
      const size_t i = index.at(t.name);
      if (shared_weight[i] > 0) add(i, t.values, shared_weight[i]);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (weight[i] == 0) continue;
    auto& v = next.mutable_tensors()[i].values;
    for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(sum[i][j] / weight[i]);
  }
  return next;
}

}  // namespace cleave
