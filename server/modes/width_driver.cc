#include "server/modes/width_driver.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "aggregation/accumulate.h"
#include "aggregation/strategy.h"
#include "cleave/v1/cleave.pb.h"
#include "compression/codec.h"
#include "models/hf_config.h"
#include "models/kinds.h"
#include "models/model.h"
#include "proto/edge_weights.h"
#include "server/modes/secagg_driver.h"
#include "server/modes/split_driver.h"
#include "server/options.h"
#include "server/server.h"

namespace cleave {

namespace {

// The rate width.clients pins for a device named `name`.
std::optional<double> Pinned(const WidthConfig& w, const std::string& name) {
  for (const WidthConfig::Client& c : w.clients) {
    if (c.name == name) return c.rate;
  }
  return std::nullopt;
}

}  // namespace

StatusOr<std::vector<Kept>> SubmodelKeptOf(const ModelSpec& spec, const ParameterSet& whole, const ParameterSet& sub,
                                           int64_t roll) {
  if (!spec.text()) return SubmodelKept(whole, sub, roll);
  int64_t head_dim = spec.gpt.dim / std::max(1, spec.gpt.heads), group = 1;
  if (ModelTraitsOf(spec.name).hf_folder) {
    ASSIGN_OR_RETURN(const DecoderConfig c, ParseHfConfig(spec.hf_config, "config.json"));
    head_dim = c.head_dim;
    group = c.heads / std::max(1, c.kv_heads);
  }
  return DecoderKept(whole, sub, head_dim, group, roll);
}

WidthDriver::WidthDriver(RoundContext& ctx) : ctx_(ctx) {
  if (ctx.config().secure_aggregation.enabled) secagg_ = std::make_unique<SecAggDriver>(ctx);
}

WidthDriver::~WidthDriver() = default;

double WidthDriver::RateOfLocked(const Session& s) const {
  if (s.edge) return 1.0;  // an edge aggregator: its devices' rates are its own
  const WidthConfig& w = ctx_.config().width;
  if (auto pinned = Pinned(w, s.name)) return *pinned;
  auto assigned = assigned_.find(s.id);
  return assigned != assigned_.end() ? assigned->second : w.rate;
}

Status WidthDriver::PrepareLocked() {
  if (!NeedsProfile()) return absl::OkStatus();
  RETURN_IF_ERROR(CostLocked(1.0).status());
  for (double rate : ctx_.config().width.rates) RETURN_IF_ERROR(CostLocked(rate).status());
  return absl::OkStatus();
}

bool WidthDriver::NeedsProfile() const { return ctx_.config().width.assign == "profile"; }

Status WidthDriver::CheckProfile(const v1::Profile& p) const {
  if (p.stage_seconds_size() == 0) return absl::InvalidArgumentError("profile has no stage times");
  return CheckProfileValues(p, p.stage_seconds_size());
}

bool WidthDriver::ServesLocked(const std::string& client_id) const {
  return !NeedsProfile() || assigned_.count(client_id) > 0;
}

void WidthDriver::SessionEndedLocked(const std::string& client_id) { assigned_.erase(client_id); }

void WidthDriver::ProfileLocked(const std::string& client_id, const v1::Profile& p) {
  Session* s = ctx_.FindSessionLocked(client_id);
  if (s == nullptr) return;
  StatusOr<double> rate = ChooseRateLocked(*s, p);
  if (!rate.ok()) {  // left out, as a device that refused a task for lack of memory
    spdlog::warn("client {} ({}) is left out: {}", client_id, s->name, std::string(rate.status().message()));
    s->unfit = std::string(rate.status().message());
    return;
  }
  assigned_[client_id] = *rate;
}

ModelSpec WidthDriver::SpecAt(double rate) const {
  ModelSpec spec = ctx_.model_spec();
  if (ctx_.config().width.ranks()) {
    spec.lora.rank = static_cast<int>(RankOf(rate));
    spec.lora.alpha = AlphaAtRank(ctx_.model_spec().lora, spec.lora.rank);
  } else {
    spec.width = rate;
  }
  return spec;
}

StatusOr<const ParameterSet*> WidthDriver::LayoutLocked(double rate) {
  auto it = layouts_.find(rate);
  if (it != layouts_.end()) return &it->second;
  ParameterSet layout;
  if (ctx_.config().width.ranks()) {  // the adapters at the rate's rank
    ASSIGN_OR_RETURN(layout, AdaptersAtRank(ctx_.model_spec(), Without(ctx_.GlobalLocked(), ctx_.frozen()),
                                            RankOf(rate)));
  } else {  // the submodel's shapes, from the model built at its width
    ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Create(SpecAt(rate)));
    layout = model->Parameters();
  }
  return &layouts_.emplace(rate, std::move(layout)).first->second;
}

StatusOr<const WidthDriver::RateCost*> WidthDriver::CostLocked(double rate) {
  auto it = costs_.find(rate);
  if (it != costs_.end()) return &it->second;
  const ModelSpec spec = SpecAt(rate);
  const std::vector<int64_t> sample = spec.text() ? std::vector<int64_t>{spec.gpt.context} : spec.input_shape;
  RateCost c;
  ASSIGN_OR_RETURN(c.cost, WholeModelCost(spec, sample, FitOf(ctx_.config().train), 3));
  ASSIGN_OR_RETURN(const ParameterSet* layout, LayoutLocked(rate));
  c.bytes = static_cast<int64_t>(layout->EncodedSize());
  return &costs_.emplace(rate, c).first->second;
}

StatusOr<double> WidthDriver::ChooseRateLocked(const Session& s, const v1::Profile& p) {
  const WidthConfig& w = ctx_.config().width;
  if (auto pinned = Pinned(w, s.name)) return *pinned;
  const TrainConfig& train = ctx_.config().train;
  // Batches per task, and the device's time per batch of the whole model.
  const int batch = std::max(1, train.batch_size);
  const int64_t steps = TaskSteps(train.local_steps, train.local_epochs, s.num_examples, batch);
  double device_s = 0;
  for (double t : p.stage_seconds()) device_s += t;
  if (p.batch_size() > 0) device_s *= static_cast<double>(batch) / p.batch_size();
  ASSIGN_OR_RETURN(const RateCost* whole, CostLocked(1.0));
  std::string why;
  for (double rate : w.rates) {
    ASSIGN_OR_RETURN(const RateCost* c, CostLocked(rate));
    double task_s = steps * device_s * c->cost.seconds / std::max(1e-9, whole->cost.seconds);
    if (p.downlink_bytes_per_s() > 0) task_s += c->bytes / p.downlink_bytes_per_s();
    if (p.uplink_bytes_per_s() > 0) task_s += c->bytes / p.uplink_bytes_per_s();
    const bool memory = p.memory_limit_bytes() == 0 || c->cost.memory_bytes <= p.memory_limit_bytes();
    const bool time = w.max_task_s == 0 || task_s <= w.max_task_s;
    const auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
    why = absl::StrFormat("rate %g needs about %.2f MiB to train (%s) and a task of about %.1f s (%s)", rate,
                          mib(c->cost.memory_bytes),
                          p.memory_limit_bytes() > 0 ? absl::StrFormat("it has %.2f MiB", mib(p.memory_limit_bytes()))
                                                     : std::string("no memory limit"),
                          task_s,
                          w.max_task_s > 0 ? absl::StrFormat("width.max_task_s %g", w.max_task_s)
                                           : std::string("no width.max_task_s"));
    if (memory && time) {
      spdlog::info("client {} ({}) gets width rate {}: {}", s.id, s.name, rate, why);
      return rate;
    }
  }
  return absl::FailedPreconditionError(absl::StrCat("no rate of width.rates fits it; the smallest, ", why));
}

int64_t WidthDriver::RankOf(double rate) const {
  return std::llround(rate * ctx_.model_spec().lora.rank);
}

const ParameterSet& WidthDriver::EdgeLayoutLocked() {
  if (edge_layout_.size() == 0) {  // the mean, then its weights
    edge_layout_ = start_.ZerosLike();
    for (const Tensor& x : start_.tensors()) {
      edge_layout_.Add(Tensor{x.name + kEdgeWeightSuffix, x.shape, std::vector<float>(x.values.size(), 0.0f)})
          .IgnoreError();  // the names are the start's, each with the suffix: all new
    }
  }
  return edge_layout_;
}

Status WidthDriver::OpenLocked(int64_t round) {
  round_ = round;
  edge_layout_ = ParameterSet();
  rates_.clear();
  submodels_.clear();
  closed_ = Sums();
  start_ = Without(ctx_.GlobalLocked(), ctx_.frozen());
  sums_ = Sums();
  sums_.round = round;
  if (secagg_) {
    // the masked vectors are summed by secagg_
  } else if (ctx_.config().dp.enabled) {
    sums_.dp = true;
  } else if (ctx_.config().width.method == "flexlora") {
    ASSIGN_OR_RETURN(sums_.products, FlexLoraSum::Create(ctx_.model_spec(), start_));
  } else if (ctx_.config().aggregation.rule != "mean") {
    sums_.updates = std::make_shared<SubmodelUpdates>(start_);
  } else {
    sums_.sum = std::make_shared<SubmodelSum>(start_);
  }
  if (!ctx_.config().width.distill.data.empty()) sums_.teachers = std::make_shared<Teachers>();
  return absl::OkStatus();
}

Status WidthDriver::BeginLocked(int64_t round, const FitSettings& fit, const std::vector<std::string>& clients) {
  RETURN_IF_ERROR(OpenLocked(round));
  for (const std::string& id : clients) {
    const double rate = RateOfLocked(*ctx_.FindSessionLocked(id));
    RETURN_IF_ERROR(SubmodelLocked(rate).status());
    rates_[id] = rate;
  }
  if (secagg_) {  // masked submodels, summed in the whole update layout
    // The elements of the widest rate's window alone are summed over its devices only: as
    // many as the masking's threshold, or the server would read fewer devices' sum.
    double widest = 0;
    int holders = 0;
    for (const auto& [id, rate] : rates_) {
      if (rate > widest) holders = 0;
      widest = std::max(widest, rate);
      if (rate == widest) ++holders;
    }
    const int t = ctx_.config().secure_aggregation.t;
    if (holders < t) {
      return absl::FailedPreconditionError(absl::StrCat(
          "round ", round, ": under secure aggregation only ", holders, " of the round's devices hold rate ", widest,
          "'s widest elements, whose sum the server would read as theirs alone; secure_aggregation.t = ", t,
          " needs as many (give the widest rate more devices)"));
    }
    secagg_->mu().AssertHeld();  // ctx_.mu()
    RETURN_IF_ERROR(secagg_->BeginLocked(round, fit, clients));
    std::map<std::string, std::shared_ptr<const SecAggSlice>> slices;
    for (const auto& [id, rate] : rates_) slices[id] = submodels_.at(rate).placement->slice;
    return secagg_->SetSlicesLocked(slices);
  }
  return absl::OkStatus();
}

Status WidthDriver::BufferOpenedLocked(int64_t version) {
  RETURN_IF_ERROR(OpenLocked(version));
  // Every rate a task of this version may get, made now: tasks are prepared as clients
  // become free, where nothing can fail.
  const WidthConfig& w = ctx_.config().width;
  std::vector<double> rates = {w.rate};
  for (const WidthConfig::Client& c : w.clients) rates.push_back(c.rate);
  if (NeedsProfile()) rates.insert(rates.end(), w.rates.begin(), w.rates.end());
  for (double rate : rates) RETURN_IF_ERROR(SubmodelLocked(rate).status());
  return absl::OkStatus();
}

StatusOr<std::shared_ptr<const WidthDriver::Placement>> WidthDriver::PlacementLocked(double rate, int64_t round) {
  const WidthConfig& w = ctx_.config().width;
  // A rank's adapters are the leading block; FedRolex's window starts one further each
  // round (version); HeteroFL's is the leading one.
  const int64_t roll = w.method == "fedrolex" ? round - 1 : 0;
  auto it = placements_.find({rate, roll});
  if (it != placements_.end()) return it->second;
  ASSIGN_OR_RETURN(const ParameterSet* layout, LayoutLocked(rate));
  auto p = std::make_shared<Placement>();
  ASSIGN_OR_RETURN(p->kept, w.ranks() ? LeadingKept(start_, *layout)
                                      : SubmodelKeptOf(ctx_.model_spec(), start_, *layout, roll));
  p->positions = std::make_shared<const std::vector<std::vector<int64_t>>>(PositionsOf(start_, p->kept));
  if (secagg_) {  // the same positions in the whole update layout, and as the wire says them
    auto slice = std::make_shared<SecAggSlice>();
    auto flat = std::make_shared<secagg::Positions>();
    int64_t offset = 0;
    for (size_t t = 0; t < start_.size(); ++t) {
      const Tensor& whole = start_.tensors()[t];
      for (int64_t at : (*p->positions)[t]) flat->push_back(offset + at);
      v1::SubmodelPlacement& placed = slice->placement.emplace_back();
      placed.set_offset(offset);
      for (int64_t d : whole.shape) placed.add_shape(d);
      for (const std::vector<int64_t>& dim : p->kept[t]) {
        v1::IndexList* list = placed.add_dims();
        for (int64_t i : dim) list->add_index(i);
      }
      offset += static_cast<int64_t>(whole.values.size());
    }
    slice->positions = std::move(flat);
    p->slice = std::move(slice);
  }
  // FedRolex's windows of versions no task can still answer are not needed again.
  const int64_t keep = ctx_.config().scheduler.async() ? ctx_.config().scheduler.max_staleness + 1 : 1;
  for (auto old = placements_.begin(); old != placements_.end();) {
    old = old->first.second < roll - keep ? placements_.erase(old) : std::next(old);
  }
  return placements_[{rate, roll}] = std::move(p);
}

StatusOr<WidthDriver::Submodel*> WidthDriver::SubmodelLocked(double rate) {
  auto it = submodels_.find(rate);
  if (it != submodels_.end()) return &it->second;
  ASSIGN_OR_RETURN(const ParameterSet* layout, LayoutLocked(rate));
  Submodel s;
  ASSIGN_OR_RETURN(s.placement, PlacementLocked(rate, round_));
  auto part = std::make_shared<const ParameterSet>(Gather(start_, *layout, *s.placement->positions));
  auto blob = std::make_shared<const std::string>(ctx_.ModelBlob(*part));
  s.digest = Sha256Hex(*blob);
  s.size = static_cast<int64_t>(blob->size());
  ctx_.AddBlobLocked(s.digest, std::move(blob), static_cast<int64_t>(part->EncodedSize()));
  s.part = std::move(part);
  return &submodels_.emplace(rate, std::move(s)).first->second;
}

void WidthDriver::PrepareTaskLocked(v1::Task* task, TaskRecord* rec) {
  // The round's clients' rates were chosen as it began; an async task's is its client's.
  auto chosen = rates_.find(rec->client_id);
  const Session* session = ctx_.FindSessionLocked(rec->client_id);
  const double rate = chosen != rates_.end() ? chosen->second
                      : session               ? RateOfLocked(*session)
                                              : ctx_.config().width.rate;
  StatusOr<Submodel*> made = SubmodelLocked(rate);  // made as the round or buffer opened
  if (!made.ok()) {  // its upload, the whole model's delta, is refused
    spdlog::error("round {}: no width-{} submodel for task {}: {}", round_, rate, rec->id, made.status().ToString());
    return;
  }
  const Submodel& s = **made;
  if (ctx_.config().width.ranks()) {
    const int64_t rank = RankOf(rate);
    task->mutable_model()->mutable_lora()->set_rank(static_cast<int32_t>(rank));
    task->mutable_model()->mutable_lora()->set_alpha(AlphaAtRank(ctx_.model_spec().lora, rank));
  } else {
    task->mutable_model()->set_width(rate);
  }
  task->set_model_digest(s.digest);
  task->set_model_size(s.size);
  rec->expected_size = ctx_.update_codec() ? EncodedTensorsSize(*ctx_.update_codec(), *s.part)
                                           : static_cast<int64_t>(s.part->EncodedSize());
  rec->edge = session != nullptr && session->edge;
  if (rec->edge) rec->expected_size = static_cast<int64_t>(EdgeLayoutLocked().EncodedSize());
  rec->width = rate;
  if (secagg_) {  // the masked input: the submodel's delta, and where it sits in the whole layout
    secagg_->mu().AssertHeld();  // ctx_.mu()
    secagg_->PrepareTaskLocked(task, rec);
    v1::SecAggTask* sa = task->mutable_secagg();
    sa->set_length(start_.total_elements());
    for (const v1::SubmodelPlacement& p : s.placement->slice->placement) *sa->add_placement() = p;
  }
}

const ParameterSet* WidthDriver::UploadLayoutLocked(const TaskRecord& t) {
  if (secagg_ || t.width <= 0) return nullptr;  // secure aggregation: a masked vector of the whole layout
  if (t.edge) return &EdgeLayoutLocked();
  StatusOr<const ParameterSet*> layout = LayoutLocked(t.width);
  return layout.ok() ? *layout : nullptr;
}

RoundDriver::AddUpload WidthDriver::ClaimUploadLocked(const TaskRecord& t) {
  if (t.width <= 0) return nullptr;
  const double rate = t.width;
  if (sums_.products) {
    return [products = sums_.products, rank = RankOf(rate)](const std::vector<TensorView>& delta,
                                                            int64_t weight) -> Status {
      return products->Add(delta, rank, static_cast<double>(weight));
    };
  }
  if (t.edge) {
    if (!sums_.sum) {
      return [](const std::vector<TensorView>&, int64_t) -> Status {
        return absl::FailedPreconditionError(
            "an edge aggregator's per-element mean needs the plain mean of submodels (aggregation.rule mean, "
            "no dp or secure aggregation)");
      };
    }
    return [sum = sums_.sum, n = start_.size()](std::vector<TensorView> views, int64_t weight) -> Status {
      if (views.size() != 2 * n) return absl::InvalidArgumentError("an edge's upload is its mean and its weights");
      std::vector<TensorView> weights(views.begin() + static_cast<std::ptrdiff_t>(n), views.end());
      views.resize(n);
      // Each element's share of the edge's weight, which is bounded as any device's.
      for (TensorView& w : weights) {
        std::vector<float> v(static_cast<size_t>(w.numel));
        w.Read(0, w.numel, v.data());
        for (float x : v) {
          if (!(x >= 0 && x <= 1)) {
            return absl::InvalidArgumentError(absl::StrCat("an edge's weight share ", x, " of ", std::string(w.name),
                                                           " is not in [0, 1]"));
          }
        }
        w.scale = static_cast<float>(weight);
      }
      return sum->AddWeighted(views, weights);
    };
  }
  StatusOr<std::shared_ptr<const Placement>> placement = PlacementLocked(rate, t.round);
  if (!placement.ok()) {
    return [s = placement.status()](const std::vector<TensorView>&, int64_t) { return s; };
  }
  const auto& positions = (*placement)->positions;
  if (sums_.dp) {  // the strategy clips and sums it, zero-padded
    return [&ctx = ctx_, positions,
            whole = std::make_shared<const ParameterSet>(start_.ZerosLike())](const std::vector<TensorView>& delta,
                                                                               int64_t weight) -> Status {
      ASSIGN_OR_RETURN(const ParameterSet placed, Placed(delta, *positions, *whole));
      ctx.Accumulate(ClientUpdate::Unnamed(ViewsOf(placed), weight));
      return absl::OkStatus();
    };
  }
  // FedDF's teacher is the device's trained submodel: its start (this round's part) plus
  // its delta (synchronous rounds only).
  auto sub = submodels_.find(rate);
  std::shared_ptr<const ParameterSet> part = sub != submodels_.end() ? sub->second.part : nullptr;
  return [sum = sums_.sum, updates = sums_.updates, positions, teachers = part ? sums_.teachers : nullptr, part,
          r = rate](const std::vector<TensorView>& delta, int64_t weight) -> Status {
    RETURN_IF_ERROR(updates ? updates->Add(delta, positions, static_cast<double>(weight))
                            : sum->Add(delta, *positions, static_cast<double>(weight)));
    if (teachers) {  // FedDF's teacher: the device's trained submodel
      ParameterSet trained = *part;
      AddScaled(delta, 1.0f, &trained);
      MutexLock l(&teachers->mu);
      teachers->models.emplace_back(r, std::move(trained));
    }
    return absl::OkStatus();
  };
}

std::optional<Status> WidthDriver::AwaitLocked(Clock::time_point deadline) {
  if (!secagg_) return std::nullopt;
  secagg_->mu().AssertHeld();  // ctx_.mu()
  return secagg_->AwaitLocked(deadline);
}

bool WidthDriver::TakeLocked(const v1::UploadHeader& h, const std::string& payload, const TaskRecord& t,
                             Status* status) {
  if (!secagg_) return false;
  secagg_->mu().AssertHeld();  // ctx_.mu()
  return secagg_->TakeLocked(h, payload, t, status);
}

void WidthDriver::TaskFailedLocked(const TaskRecord& t) {
  if (!secagg_) return;
  secagg_->mu().AssertHeld();  // ctx_.mu()
  secagg_->TaskFailedLocked(t);
}

void WidthDriver::ClientLeftLocked(const std::string& client_id) {
  if (!secagg_) return;
  secagg_->mu().AssertHeld();  // ctx_.mu()
  secagg_->ClientLeftLocked(client_id);
}

void WidthDriver::CloseLocked(int64_t round, RoundMetrics* m) {
  if (sums_.dp) sums_.holders = start_.ZerosLike();
  const bool async = ctx_.config().scheduler.async();
  for (const auto& [id, t] : ctx_.TasksLocked()) {
    // An async buffer's uploads: the tasks resolved into it, of any version.
    if (t.width <= 0 || t.state != TaskState::kDone || (async && t.resolved_in != round)) continue;
    // By name; a second participant of the same name (names are unique only under mutual
    // TLS) with its client id beside it, so that neither hides the other.
    const Session* s = ctx_.FindSessionLocked(t.client_id);
    std::string key = s ? s->name : t.client_id;
    if (m->widths.count(key)) key = absl::StrCat(key, " (", t.client_id, ")");
    m->widths[key] = t.width;
    StatusOr<std::shared_ptr<const Placement>> placement = PlacementLocked(t.width, t.round);
    if (!placement.ok()) continue;  // made when its upload was claimed
    if (sums_.dp) CountHolders(*(*placement)->positions, &sums_.holders);
    if (secagg_) {
      sums_.masked[t.client_id] = {t.width, t.num_examples};
      sums_.positions[t.width] = (*placement)->positions;
    }
  }
  if (secagg_) {
    secagg_->mu().AssertHeld();  // ctx_.mu()
    secagg_->CloseLocked(round, m);
  }
  closed_ = std::move(sums_);
  sums_ = Sums();
}

Status WidthDriver::DistillInto(ParameterSet* whole, const Teachers& teachers, int64_t round) {
  const WidthConfig::Distill& o = ctx_.config().width.distill;
  MutexLock l(&teachers.mu);  // the round's uploads are added: nobody else holds it now
  if (teachers.models.empty()) return absl::OkStatus();
  if (!distill_data_) {
    ASSIGN_OR_RETURN(Dataset d, LoadDataSpec(o.data, /*train=*/true));
    distill_data_ = std::move(d);
  }
  // The ensemble: the mean of the devices' logits.
  std::vector<float> mean;
  for (const auto& [rate, params] : teachers.models) {
    ASSIGN_OR_RETURN(std::unique_ptr<Model> teacher, Model::Create(SpecAt(rate)));
    RETURN_IF_ERROR(teacher->SetParameters(params));
    ASSIGN_OR_RETURN(std::vector<float> logits, teacher->Outputs(*distill_data_, 256));
    if (mean.empty()) mean.assign(logits.size(), 0.0f);
    if (logits.size() != mean.size()) return absl::InternalError("width.distill: teachers of other outputs");
    for (size_t i = 0; i < logits.size(); ++i) mean[i] += logits[i] / static_cast<float>(teachers.models.size());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Model> student, Model::Create(ctx_.model_spec()));
  RETURN_IF_ERROR(student->SetParameters(*whole));
  DistillOptions d;
  d.steps = o.steps;
  d.lr = o.lr;
  d.batch_size = o.batch_size;
  d.temperature = o.temperature;
  d.seed = ctx_.config().run.seed * 1000003 + static_cast<uint64_t>(round);
  ASSIGN_OR_RETURN(const double loss, student->Distill(*distill_data_, mean, d));
  spdlog::info("round {}: FedDF distilled {} devices' submodels into the whole model ({} steps on {} examples, "
               "loss {:.4f})",
               round, teachers.models.size(), o.steps, distill_data_->size, loss);
  *whole = student->Parameters();
  return absl::OkStatus();
}

Status WidthDriver::Fold(const ParameterSet& start, int64_t /*weight*/) {
  const Sums closed = std::move(closed_);
  closed_ = Sums();
  if (closed.dp) {  // the uploads are in the strategy already
    ctx_.strategy().SetHolders(closed.holders);
    return absl::OkStatus();
  }
  ParameterSet change;
  if (secagg_) {
    // The survivors' masked vectors: sum of weight / max_weight x each one's delta, placed.
    ASSIGN_OR_RETURN(SecAggDriver::Unmasked u, secagg_->TakeUnmasked());
    if (static_cast<int64_t>(u.sum.size()) != start.total_elements()) {
      return absl::InternalError("secure aggregation: the unmasked sum is not the update layout's length");
    }
    ParameterSet weight = start.ZerosLike();  // per element, the holders' scales
    for (const std::string& client : u.survivors) {
      auto c = closed.masked.find(client);
      if (c == closed.masked.end()) return absl::InternalError(absl::StrCat("no rate for survivor ", client));
      const auto& [rate, examples] = c->second;
      const double scale = secagg_->UniformWeights()
                               ? 1.0
                               : std::min(1.0, static_cast<double>(examples) / static_cast<double>(u.max_weight));
      const auto& positions = *closed.positions.at(rate);
      for (size_t t = 0; t < positions.size(); ++t) {
        auto& w = weight.mutable_tensors()[t].values;
        for (int64_t p : positions[t]) w[p] += static_cast<float>(scale);
      }
    }
    change = start.ZerosLike();
    size_t i = 0;
    for (size_t t = 0; t < change.size(); ++t) {
      auto& v = change.mutable_tensors()[t].values;
      const auto& w = weight.tensors()[t].values;
      for (size_t e = 0; e < v.size(); ++e, ++i) v[e] = w[e] > 0 ? static_cast<float>(u.sum[i] / w[e]) : 0.0f;
    }
    spdlog::info("secure aggregation: unmasked the sum of {} submodels", u.survivors.size());
  } else if (closed.products) {  // FlexLoRA: the factored mean product, as a change of the start
    ASSIGN_OR_RETURN(change, closed.products->Result());
    if (!change.SameLayout(start)) return absl::InternalError("flexlora: the result is not the round's layout");
    AddScaled(ViewsOf(start), -1.0f, &change);
  } else if (closed.updates) {
    ASSIGN_OR_RETURN(change, closed.updates->Aggregate(ctx_.config().aggregation));
  } else if (closed.sum) {
    change = ctx_.config().width.method == "hetlora" ? closed.sum->ZeroPadded(start) : closed.sum->Mean();
    last_weights_ = closed.sum->Weights();
  } else {
    return absl::InternalError("width: no closed round to aggregate");
  }
  if (closed.teachers) {
    // FedDF on the aggregate (start + mean), distilled, as a change of the start.
    ParameterSet whole = start;
    AddScaled(ViewsOf(change), 1.0f, &whole);
    RETURN_IF_ERROR(DistillInto(&whole, *closed.teachers, closed.round));
    AddScaled(ViewsOf(start), -1.0f, &whole);
    change = std::move(whole);
  }
  ctx_.Accumulate(ClientUpdate::Unnamed(ViewsOf(change), 1));
  return absl::OkStatus();
}

}  // namespace cleave
