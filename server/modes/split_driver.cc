#include "server/modes/split_driver.h"

#include <spdlog/spdlog.h>

#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "aggregation/strategy.h"
#include "aggregation/weighting.h"
#include "compression/codec.h"
#include "core/printable.h"
#include "models/inversion.h"
#include "models/kinds.h"
#include "models/part.h"
#include "server/modes/secagg_driver.h"
#include "server/observe/observe.h"
#include "server/options.h"
#include "server/server.h"
#include "split/leakage.h"

namespace cleave {

std::string SplitTensorCodec(const std::string& spec) {
  return CodecFamily(spec) == "none" ? "" : spec;
}

SplitDriver::SplitDriver(RoundContext& ctx) : ctx_(ctx) {
  // Pipelines under secure aggregation (job/rules.cc allows no other split mode).
  if (ctx.config().secure_aggregation.enabled) secagg_ = std::make_unique<SecAggDriver>(ctx);
}
SplitDriver::~SplitDriver() = default;

// A pipeline's planner places segments from the profiles even at a fixed cut.
bool SplitDriver::NeedsProfile() const {
  return ctx_.config().split.auto_cut() || ctx_.config().split.Is(SplitMode::kPipeline);
}

Status SplitDriver::InitLocked(const ModelSpec& spec, const Model& model) {
  const FederationConfig& cfg = ctx_.config();
  ASSIGN_OR_RETURN(mode_, ParseSplitMode(cfg.split.mode));
  num_stages_ = model.num_stages();
  tail_begin_ = cfg.split.keeps_head() ? num_stages_ - cfg.split.tail : num_stages_;
  if (tail_begin_ < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", cfg.model.name, " has ", num_stages_, " stages: too few to cut",
        cfg.split.keeps_head() ? absl::StrCat(" with split.tail ", cfg.split.tail) : ""));
  }
  if (cfg.split.cut >= tail_begin_) {
    return absl::InvalidArgumentError(absl::StrCat("split.cut ", cfg.split.cut, " is not in [1, ",
                                                   tail_begin_ - 1, "] for model ",
                                                   cfg.model.name));
  }
  // A language model reads model.gpt.context token ids and predicts one of vocab.
  const bool text = spec.text();
  const std::vector<int64_t> sample = text ? std::vector<int64_t>{spec.gpt.context} : spec.input_shape;
  num_classes_ = text ? static_cast<int>(spec.gpt.vocab) : spec.num_classes;
  ASSIGN_OR_RETURN(server_profile_, ProfileStages(spec, sample, cfg.train.batch_size, 3, cfg.train.recompute));
  stage_shapes_ = {sample};
  for (const auto& p : server_profile_) stage_shapes_.push_back(p.out_shape);
  // What the cost model needs from the model and this server; ProblemFor adds a client.
  model_problem_ = ModelCutProblem(server_profile_, sample, cfg.train, cfg.split.window);
  CutProblem& p = model_problem_;
  // Tensors travel in chunks (proto/split_chunks.h): a micro-batch is bounded by the
  // largest tensor the server takes, not by a message.
  p.max_message_bytes = 4 * cfg.server.max_model_elements;
  p.tail_begin = cfg.split.keeps_head() ? tail_begin_ : -1;
  auto factor = [](const std::string& codec_spec) {  // encoded / float32 bytes
    auto codec = MakeStatelessCodec(codec_spec, 0);
    return codec.ok() && *codec ? (*codec)->EncodedSize({1 << 20}) / double{4 << 20} : 1.0;
  };
  p.activation_bytes_factor = factor(cfg.compression.activations);
  p.gradient_bytes_factor = factor(cfg.compression.gradients);
  if (cfg.split.max_reconstruction_ssim > 0 || cfg.split.max_token_recovery > 0) {
    RETURN_IF_ERROR(MeasureLeakage(spec, model.Parameters()));
  }
  if (!cfg.split.hijack.empty()) RETURN_IF_ERROR(StartHijack(spec));
  if (!cfg.split.auto_cut()) {  // a fixed cut must let a micro-batch through one message
    const CutPrediction r = PredictStep(p, cfg.split.cut);
    if (!r.fits) {
      return absl::InvalidArgumentError(absl::StrCat("split.cut ", cfg.split.cut, ": ", r.why_not,
                                                     "; lower train.batch_size or cut deeper"));
    }
  }
  spdlog::info("split learning: {}, {} stages, cut {}, window {}", cfg.split.mode, num_stages_,
               cfg.split.auto_cut() ? "auto" : std::to_string(cfg.split.cut), cfg.split.window);
  return absl::OkStatus();
}

Status SplitDriver::StartHijack(const ModelSpec& spec) {
  const FederationConfig& cfg = ctx_.config();
  if (spec.text()) return absl::InvalidArgumentError("split.hijack reconstructs images and tables: model " + spec.name + " reads tokens");
  if (cfg.data.test.empty()) return absl::InvalidArgumentError("split.hijack trains on the server's own data: set data.test");
  auto aux = LoadDataSpec(cfg.data.test, /*train=*/false);
  if (!aux.ok()) return absl::InvalidArgumentError(absl::StrCat("data.test: ", aux.status().message()));
  std::vector<int64_t> all(static_cast<size_t>(aux->size));
  std::iota(all.begin(), all.end(), 0);
  InversionOptions range;
  SetInputRange(*aux, &range);
  HijackOptions o;
  o.lo = range.lo, o.hi = range.hi;
  o.seed = cfg.run.seed;
  auto hijack = FeatureSpaceHijack::Create(spec, cfg.split.cut, InputBatch(*aux, all), o);
  if (!hijack.ok()) return absl::InvalidArgumentError(absl::StrCat("split.hijack: ", hijack.status().message()));
  hijack_ = *std::move(hijack);
  spdlog::warn("split.hijack fsha: RED TEAM: this server attacks its devices by feature-space hijacking at cut {} "
               "(trained on {} of its test inputs) and trains no model",
               cfg.split.cut, aux->size);
  return absl::OkStatus();
}

Status SplitDriver::MeasureLeakage(const ModelSpec& spec, const ParameterSet& model) {
  const FederationConfig& cfg = ctx_.config();
  const bool images = cfg.split.max_reconstruction_ssim > 0;
  const std::string key = images ? "split.max_reconstruction_ssim" : "split.max_token_recovery";
  const double floor = images ? cfg.split.max_reconstruction_ssim : cfg.split.max_token_recovery;
  if (images && (spec.text() || spec.input_shape.size() != 3)) {
    return absl::InvalidArgumentError(absl::StrCat(key, " measures how well images are reconstructed: model ", spec.name,
                                                   " does not read images",
                                                   spec.text() ? "; for a decoder, split.max_token_recovery" : ""));
  }
  if (!images && !ModelTraitsOf(spec.name).gpt2) {
    return absl::InvalidArgumentError(absl::StrCat(key, " measures how many of a decoder's tokens are recovered: model ",
                                                   spec.name, " is not a decoder (model gpt)"));
  }
  if (cfg.data.test.empty()) return absl::InvalidArgumentError(absl::StrCat(key, " attacks the server's own data: set data.test"));
  auto aux = LoadDataSpec(cfg.data.test, /*train=*/false);
  if (!aux.ok()) return absl::InvalidArgumentError(absl::StrCat("data.test: ", aux.status().message()));
  ClientPartView view;
  view.spec = spec;
  view.part = model;
  view.noise = cfg.split.activation_noise;
  view.codec = cfg.compression.activations;
  model_problem_.leakage.assign(tail_begin_, -1);
  model_problem_.max_leakage = floor;
  model_problem_.leakage_key = key;
  std::string measured;
  for (int cut = 1; cut < tail_begin_; ++cut) {
    view.cut = cut;
    auto leak = images ? MeasureReconstructionSsim(view, *aux) : MeasureTokenRecovery(view, *aux);
    if (!leak.ok()) return absl::InvalidArgumentError(absl::StrCat(key, ": ", leak.status().message()));
    model_problem_.leakage[cut] = *leak;
    absl::StrAppend(&measured, cut > 1 ? ", " : "", absl::StrFormat("cut %d: %.3f", cut, *leak));
  }
  spdlog::info("{} {}: the server's own {} on its test data measures {} (the automatic cut takes none above the floor)",
               key, floor, images ? "reconstruction attack (SSIM)" : "token inversion (share of tokens recovered)",
               measured);
  return absl::OkStatus();
}

Status SplitDriver::CheckProfile(const v1::Profile& p) const {
  return CheckProfileValues(p, num_stages_);
}

Status CheckProfileValues(const v1::Profile& p, int num_stages) {
  if (p.stage_seconds_size() != num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("profile has ", p.stage_seconds_size(),
                                                   " stage times, the model ", num_stages));
  }
  for (double t : p.stage_seconds()) {
    if (!std::isfinite(t) || t < 0) {
      return absl::InvalidArgumentError("profile stage times must be finite and >= 0");
    }
  }
  for (double v : {p.uplink_bytes_per_s(), p.downlink_bytes_per_s(), p.rtt_s()}) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError("profile link measurements must be finite and >= 0");
    }
  }
  if (p.memory_limit_bytes() < 0) return absl::InvalidArgumentError("negative memory limit");
  return absl::OkStatus();
}

void SplitDriver::ProfileLocked(const std::string& client_id, const v1::Profile& p) {
  clients_[client_id].profile = p;
  spdlog::info("client {} profiled: {:.1f} ms per batch for the whole model, up {:.2f} MB/s, "
               "down {:.2f} MB/s, memory limit {} MB",
               client_id,
               1e3 * std::accumulate(p.stage_seconds().begin(), p.stage_seconds().end(), 0.0),
               p.uplink_bytes_per_s() / 1e6, p.downlink_bytes_per_s() / 1e6,
               p.memory_limit_bytes() >> 20);
  ctx_.Wake();
}

void SplitDriver::DescribeClientLocked(const std::string& client_id, ClientHealth* c) const {
  auto it = clients_.find(client_id);
  if (it == clients_.end()) return;
  c->uplink_mbps = it->second.profile.uplink_bytes_per_s() * 8 / 1e6;
  c->downlink_mbps = it->second.profile.downlink_bytes_per_s() * 8 / 1e6;
  c->cut = it->second.prediction.cut;
}

CutProblem SplitDriver::ProblemFor(const v1::Profile& profile, int clients_in_round) const {
  CutProblem p = model_problem_;
  p.client_stage_s.assign(profile.stage_seconds().begin(), profile.stage_seconds().end());
  // One shared server part runs one step at a time; per-client copies share the pool.
  p.server_load = mode_ == SplitMode::kSflV1 || mode_ == SplitMode::kPipeline
                      ? std::max(1.0, static_cast<double>(clients_in_round) /
                                          ctx_.config().server.worker_threads)
                      : clients_in_round;
  p.up_bps = profile.uplink_bytes_per_s();
  p.down_bps = profile.downlink_bytes_per_s();
  p.rtt_s = profile.rtt_s();
  p.memory_limit_bytes = profile.memory_limit_bytes();
  return p;
}

Status SplitDriver::ChooseLocked(int64_t round, const FitSettings& fit,
                                std::vector<std::string>* clients) {
  const FederationConfig& cfg = ctx_.config();
  part_blobs_.clear();
  tasks_.clear();
  up_ = 0;
  down_ = 0;
  labels_ = 0;
  closed_.reset();
  if (mode_ == SplitMode::kPipeline) return BeginPipelineLocked(round, fit, clients);
  std::map<std::string, int> cuts;
  std::vector<std::string> chosen;
  // In sl the clients take turns, one at a time, so the server serves one at a time.
  const int concurrent = mode_ == SplitMode::kSl ? 1 : static_cast<int>(clients->size());
  for (const auto& cid : *clients) {
    const std::string& name = ctx_.FindSessionLocked(cid)->name;
    auto profiled = clients_.find(cid);
    if (profiled == clients_.end()) {  // a fixed cut needs no profile
      cuts[cid] = cfg.split.cut;
      chosen.push_back(cid);
      continue;
    }
    ClientState& s = profiled->second;
    auto policy = !cfg.split.auto_cut() ? MakeFixedPolicy(cfg.split.cut) : MakeCostModelPolicy();
    auto choice = policy->Choose(s.feedback.Apply(ProblemFor(s.profile, concurrent)));
    if (!choice.ok()) {
      spdlog::warn("round {}: client {} ({}) left out: {}", round, cid, name,
                   std::string(choice.status().message()));
      continue;
    }
    s.prediction = *choice;
    cuts[cid] = choice->cut;
    chosen.push_back(cid);
    spdlog::info("round {}: client {} ({}) cut at {} by {}: predicted step {:.1f} ms (client "
                 "{:.1f}, up {:.1f}, server {:.1f}, down {:.1f}), client memory {} KiB{}",
                 round, cid, name, choice->cut, policy->name(), 1e3 * choice->step_s,
                 1e3 * choice->client_s, 1e3 * choice->up_s, 1e3 * choice->server_s,
                 1e3 * choice->down_s, choice->client_memory_bytes >> 10,
                 model_problem_.max_leakage > 0
                     ? absl::StrFormat(", measured leakage %.3f under %s %g", choice->leakage,
                                       model_problem_.leakage_key, model_problem_.max_leakage)
                     : "");
  }
  if (chosen.empty()) return absl::AbortedError(absl::StrCat("round ", round, ": no client to cut for"));
  ASSIGN_OR_RETURN(round_, SplitRound::Create(RoundOptionsLocked(fit), ctx_.GlobalLocked(), cuts));
  *clients = std::move(chosen);
  return absl::OkStatus();
}

SplitRoundOptions SplitDriver::RoundOptionsLocked(const FitSettings& fit) const {
  SplitRoundOptions o;
  o.mode = mode_;
  o.model = ctx_.model_spec();
  o.training = LocalTrainOptions(fit, ctx_.config().run.seed);
  o.num_stages = num_stages_;
  o.tail_begin = tail_begin_;
  o.max_batch = fit.batch_size;
  o.num_classes = num_classes_;
  o.stage_input_shapes = stage_shapes_;
  o.quantized = ctx_.quantized_base();
  o.micro_batches = ctx_.config().split.micro_batches;
  o.hijack = hijack_;
  if (const ModelTraits kind = ModelTraitsOf(ctx_.model_spec().name); kind.has_private_tensors()) {
    // the devices' own bases and fusion layers (interop)
    for (const Tensor& t : ctx_.GlobalLocked().tensors()) {
      if (kind.private_tensor(t.name)) o.private_names.push_back(t.name);
    }
  }
  return o;
}

Status SplitDriver::BeginLocked(int64_t round, const FitSettings& /*fit*/, const std::vector<std::string>& clients) {
  if (mode_ != SplitMode::kPipeline) return absl::OkStatus();
  // Every device of a chain weighs its data owner's examples, capped as a client's are
  // by the round's weights (sized from the devices the chains hold).
  for (const SplitChain& c : chains_) {
    const int64_t weight = ctx_.RoundWeightsLocked().Weight(ctx_.FindSessionLocked(c.devices[0])->num_examples);
    for (const std::string& id : c.devices) chain_weights_[id] = weight;
  }
  if (!secagg_) return absl::OkStatus();
  // The masked vector: the update layout's tensors that some chain's device trains.
    masked_ = MaskedLayout();
    for (const Tensor& t : ctx_.UpdateLayoutLocked().tensors()) {
      ASSIGN_OR_RETURN(const int stage, round_->StageOf(t.name));
      bool held = stage >= tail_begin_;
      for (const SplitChain& c : chains_) held = held || stage < c.bounds.back();
      if (!held) continue;
      const int64_t size = static_cast<int64_t>(t.values.size());
      masked_.slots[t.name] = {masked_.length, size};
      masked_.length += size;
    }
  int64_t max_weight = 1;
  for (const auto& [id, w] : chain_weights_) max_weight = std::max(max_weight, w);
  secagg_->mu().AssertHeld();  // ctx_.mu()
  return secagg_->StartLocked(round, clients, masked_.length, max_weight);
}

void SplitDriver::PrepareTaskLocked(v1::Task* task, TaskRecord* rec) {
  // The client part, published as a blob of its own. Parts of the same segment (the same
  // cut; in a pipeline the same [begin, cut)) are the same tensors, so the round builds,
  // encodes and hashes each segment's once (in sl each turn has its own: the clients
  // before it changed it).
  SplitTask& st = tasks_[rec->id];
  st.begin = *round_->BeginOf(rec->client_id);
  st.cut = *round_->CutOf(rec->client_id);
  const Segment segment = {st.begin, st.cut};
  PartBlob turn;
  PartBlob& pb = mode_ == SplitMode::kSl ? turn : part_blobs_[segment];
  const std::vector<std::string>& frozen = ctx_.frozen();
  if (!pb.part) PublishPartLocked(rec->client_id, segment, &pb);
  st.part = pb.part;
  task->clear_base_digest();
  task->clear_base_size();
  if (!frozen.empty()) {
    task->set_base_digest(cut_bases_[segment].first);
    task->set_base_size(cut_bases_[segment].second);
  }
  // A quantized base: the weights of the client's stages, in a blob per segment too.
  task->clear_quantized_base_digest();
  task->clear_quantized_base_size();
  if (!ctx_.quantized_base().empty()) {
    const auto& [digest, size] = QuantizedBaseLocked(segment);
    task->set_quantized_base_digest(digest);
    task->set_quantized_base_size(size);
  }
  task->set_model_digest(pb.digest);
  task->set_model_size(pb.size);
  const Codec* codec = ctx_.update_codec();
  rec->expected_size = codec ? EncodedTensorsSize(*codec, *st.part)
                             : static_cast<int64_t>(st.part->EncodedSize());
  const FederationConfig& cfg = ctx_.config();
  auto* split = task->mutable_split();
  split->Clear();
  if (mode_ == SplitMode::kPipeline) {
    *split = hops_.at(rec->client_id);
    // The data owner keeps this many micro-batches in flight: all of a batch's (GPipe), or
    // one per holder of the chain after it, the server's included (1F1B). By a token
    // budget a batch has up to one micro-batch per sequence.
    const int holders = static_cast<int>(chains_.at(split->chain()).devices.size()) + 1;
    const int most = cfg.split.micro_batch_tokens > 0 ? std::max(1, cfg.train.batch_size) : cfg.split.micro_batches;
    split->set_window(cfg.split.schedule == "gpipe" ? most : std::min(most, holders));
  } else {
    split->set_window(cfg.split.window);
  }
  split->set_mode(cfg.split.mode);
  split->set_cut(st.cut);
  split->set_tail_begin(tail_begin_);
  split->set_num_stages(num_stages_);
  split->set_activation_codec(SplitTensorCodec(cfg.compression.activations));
  split->set_gradient_codec(SplitTensorCodec(cfg.compression.gradients));
  split->set_activation_noise(cfg.split.activation_noise);
  split->set_nopeek(cfg.split.nopeek);
  split->set_label_epsilon(cfg.split.label_epsilon);
  if (secagg_) {  // the upload is a masked vector of the round's layout (MaskedLayout)
    secagg_->mu().AssertHeld();  // ctx_.mu()
    secagg_->PrepareTaskLocked(task, rec);
    const int64_t weight = chain_weights_.at(rec->client_id);
    MaskedLayout::Holder& holder = masked_.holders[rec->client_id];
    holder.weight = weight;
    split->set_chain_weight(weight);
    split->set_secagg_length(masked_.length);
    for (const Tensor& t : st.part->tensors()) {
      split->add_secagg_offsets(masked_.slots.at(t.name).offset);  // a trained tensor: in the layout
      holder.tensors.push_back(t.name);
    }
  }
}

void SplitDriver::PublishPartLocked(const std::string& client_id, const Segment& segment, PartBlob* pb) {
  // Interoperable architectures: the device's base and fusion are its own; nothing of
  // them is sent (or uploaded): its part is empty, or U-shaped the shared tail alone.
  ParameterSet part = *round_->ClientPart(client_id);
  // LoRA: the part's adapters travel (down and up); its frozen tensors come from a base
  // of the part's own frozen tensors (the same every round: pinned), which the client
  // fetches once per segment.
  if (const std::vector<std::string>& frozen = ctx_.frozen(); !frozen.empty()) {
    auto& base = cut_bases_[segment];
    if (base.first.empty()) {
      auto blob = std::make_shared<const std::string>(Only(part, frozen).Encode());
      base = {Sha256Hex(*blob), static_cast<int64_t>(blob->size())};
      ctx_.PinBlobLocked(base.first, std::move(blob));
    }
    part = Without(part, frozen);
  }
  auto blob = std::make_shared<const std::string>(ctx_.ModelBlob(part));
  pb->digest = Sha256Hex(*blob);
  pb->size = static_cast<int64_t>(blob->size());
  ctx_.AddBlobLocked(pb->digest, std::move(blob), static_cast<int64_t>(part.EncodedSize()));
  pb->part = std::make_shared<const ParameterSet>(std::move(part));
}

const std::pair<std::string, int64_t>& SplitDriver::QuantizedBaseLocked(const Segment& segment) {
  auto& q = cut_quantized_[segment];
  if (!q.first.empty()) return q;
  const auto [begin, cut] = segment;
  QuantizedSet mine;
  mine.spec = ctx_.quantized_base().spec;
  for (const QuantizedTensor& t : ctx_.quantized_base().tensors) {
    const int stage = std::stoi(t.name.substr(0, t.name.find('.')));
    // The head's (U-shaped) only for the client at stage 0, the data owner.
    if ((stage >= begin && stage < cut) || (begin == 0 && stage >= tail_begin_)) {
      mine.tensors.push_back(t);
    }
  }
  auto blob = std::make_shared<const std::string>(mine.Encode());
  q = {Sha256Hex(*blob), static_cast<int64_t>(blob->size())};
  ctx_.PinBlobLocked(q.first, std::move(blob));
  return q;
}

std::optional<Status> SplitDriver::AwaitLocked(Clock::time_point deadline) {
  if (!secagg_) return std::nullopt;
  secagg_->mu().AssertHeld();  // ctx_.mu()
  return secagg_->AwaitLocked(deadline);
}

bool SplitDriver::TakeLocked(const v1::UploadHeader& h, const std::string& payload, const TaskRecord& t,
                             Status* status) {
  if (!secagg_) return false;
  secagg_->mu().AssertHeld();  // ctx_.mu()
  return secagg_->TakeLocked(h, payload, t, status);
}

void SplitDriver::ClientLeftLocked(const std::string& client_id) {
  if (!secagg_) return;
  secagg_->mu().AssertHeld();  // ctx_.mu()
  secagg_->ClientLeftLocked(client_id);
}

Status SplitDriver::CheckUploadLocked(const TaskRecord& /*t*/, const v1::UploadHeader& h) {
  const auto& st = h.split();
  for (double v : {st.client_compute_s(), st.transfer_s(), st.server_compute_s(), st.wall_s()}) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError("split stats must be finite and >= 0");
    }
  }
  if (st.spans_size() > 64) return absl::InvalidArgumentError("more than 64 pipeline spans");
  for (const v1::PipelineSpan& x : st.spans()) {
    if (!std::isfinite(x.start_s()) || !std::isfinite(x.end_s()) || x.end_s() < x.start_s() ||
        x.micro_batch() < 0) {
      return absl::InvalidArgumentError("a pipeline span must be finite, end after it starts, micro-batch >= 0");
    }
  }
  return absl::OkStatus();
}

const ParameterSet* SplitDriver::UploadLayoutLocked(const TaskRecord& t) {
  auto it = tasks_.find(t.id);
  return it != tasks_.end() ? it->second.part.get() : nullptr;
}

void SplitDriver::AcceptedLocked(const TaskRecord& t, const v1::UploadHeader& h) {
  auto it = tasks_.find(t.id);
  if (it == tasks_.end()) return;
  it->second.stats = h.split();
  if (Session* s = ctx_.FindSessionLocked(t.client_id)) s->step_s = h.split().wall_s();
}

RoundDriver::AddUpload SplitDriver::ClaimUploadLocked(const TaskRecord& t) {
  // The client's trained part: the part it was given plus its delta (with LoRA, the
  // adapters; the frozen tensors are as the round started). Added into the split round
  // under its own lock.
  auto chain = chain_weights_.find(t.client_id);
  const int64_t chain_weight = chain != chain_weights_.end() ? chain->second : 0;
  return [this, round = round_, part = tasks_.at(t.id).part, client = t.client_id, chain_weight](
             const std::vector<TensorView>& delta, int64_t weight) -> Status {
    ParameterSet trained = *part;
    for (size_t i = 0; i < delta.size(); ++i) {
      auto& v = trained.mutable_tensors()[i].values;
      std::vector<float> d(v.size());
      delta[i].Read(0, delta[i].numel, d.data());
      for (size_t j = 0; j < v.size(); ++j) v[j] += d[j];
    }
    if (!ctx_.frozen().empty()) {
      ASSIGN_OR_RETURN(ParameterSet whole, round->ClientPart(client));
      RETURN_IF_ERROR(Overwrite(trained, &whole));
      trained = std::move(whole);
    }
    return round->Finish(client, trained, chain_weight > 0 ? chain_weight : weight);
  };
}

void SplitDriver::CloseLocked(int64_t round, RoundMetrics* m) {
  SplitMetrics& sm = m->split.emplace();
  sm.activation_bytes_up = up_;
  sm.gradient_bytes_down = down_;
  sm.labels_up = labels_;
  if (mode_ == SplitMode::kPipeline) ClosePipelineLocked(round, &sm);
  for (const auto& [id, t] : ctx_.TasksLocked()) {
    auto it = tasks_.find(id);
    if (it == tasks_.end()) continue;
    const SplitTask& st = it->second;
    const Session* s = ctx_.FindSessionLocked(t.client_id);
    const std::string name = s ? s->name : t.client_id;
    sm.cuts[name] = st.cut;
    if (t.state != TaskState::kDone) continue;
    sm.step_s += st.stats.wall_s();
    sm.client_compute_s += st.stats.client_compute_s();
    sm.transfer_s += st.stats.transfer_s();
    sm.server_compute_s += st.stats.server_compute_s();
    auto c = clients_.find(t.client_id);
    if (s && c != clients_.end() && c->second.prediction.cut == st.cut) {
      ClientState& client = c->second;
      spdlog::info("round {}: client {} at cut {}: predicted step {:.1f} ms, measured {:.1f} ms "
                   "(client {:.1f}, transfer {:.1f}, server {:.1f})",
                   round, name, st.cut, 1e3 * client.prediction.step_s, 1e3 * st.stats.wall_s(),
                   1e3 * st.stats.client_compute_s(), 1e3 * st.stats.transfer_s(),
                   1e3 * st.stats.server_compute_s());
      client.feedback.Observe(client.prediction, st.stats.client_compute_s(),
                              st.stats.transfer_s(), st.stats.server_compute_s());
    }
  }
  if (round_) {
    const SplitRound::Load load = round_->ServerLoad();
    sm.server_busy = load.span_s > 0 ? load.busy_s / load.span_s : 0;
  }
  if (m->participants > 0) {
    sm.step_s /= m->participants;
    sm.client_compute_s /= m->participants;
    sm.transfer_s /= m->participants;
    sm.server_compute_s /= m->participants;
  }
  closed_ = std::move(round_);
  if (secagg_) {
    secagg_->mu().AssertHeld();  // ctx_.mu()
    secagg_->CloseLocked(round, m);
    masked_closed_ = std::move(masked_);
    masked_ = MaskedLayout();
  }
}

Status SplitDriver::Fold(const ParameterSet& start, int64_t /*weight*/) {
  const std::shared_ptr<SplitRound> round = std::move(closed_);
  if (!round) return absl::InternalError("split learning: no closed round to aggregate");
  std::map<std::string, SplitRound::MaskedSum> masked;
  if (secagg_) {
    // The devices' parts come in the unmasked sum of chain weight / max_weight x each
    // survivor's vector: per tensor, the sum over its holders of weight x delta.
    ASSIGN_OR_RETURN(SecAggDriver::Unmasked u, secagg_->TakeUnmasked());
    const MaskedLayout layout = std::move(masked_closed_);
    for (const auto& [name, slot] : layout.slots) {
      SplitRound::MaskedSum& m = masked[name];
      m.weighted_delta.assign(u.sum.begin() + slot.offset, u.sum.begin() + slot.offset + slot.size);
      for (double& v : m.weighted_delta) v *= static_cast<double>(u.max_weight);
    }
    for (const std::string& client : u.survivors) {
      auto h = layout.holders.find(client);
      if (h == layout.holders.end()) return absl::InternalError(absl::StrCat("no masked layout for ", client));
      for (const std::string& name : h->second.tensors) masked.at(name).weight += static_cast<double>(h->second.weight);
      RETURN_IF_ERROR(round->FinishMasked(client, h->second.weight));  // its server copy counts
    }
    spdlog::info("secure aggregation: unmasked the sum of {} pipeline segments", u.survivors.size());
  }
  ASSIGN_OR_RETURN(ParameterSet mean, round->Aggregate(masked));
  // The mean's change from the round's model, in the update layout (a LoRA model's
  // frozen base is left out), as one result that is no single client's.
  ParameterSet delta = start;
  for (auto& t : delta.mutable_tensors()) {
    const Tensor* after = mean.Find(t.name);
    if (after == nullptr || after->values.size() != t.values.size()) {
      return absl::InternalError(absl::StrCat("the split round's model lacks tensor ", t.name));
    }
    for (size_t j = 0; j < t.values.size(); ++j) t.values[j] = after->values[j] - t.values[j];
  }
  ctx_.Accumulate(ClientUpdate::Unnamed(ViewsOf(delta), 1));
  return absl::OkStatus();
}

StatusOr<SplitStreamTask> SplitDriver::OpenLocked(const v1::SplitOpen& open) {
  TaskMap& tasks = ctx_.TasksLocked();
  auto t = tasks.find(open.task_id());
  auto st = tasks_.find(open.task_id());
  if (t == tasks.end() || t->second.client_id != open.client_id() || st == tasks_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("no split task ", Printable(open.task_id()),
                                                      " for client ", Printable(open.client_id())));
  }
  if (t->second.state != TaskState::kAssigned) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", Printable(open.task_id()), " is over"));
  }
  if (st->second.open) {
    return absl::AlreadyExistsError(
        absl::StrCat("task ", Printable(open.task_id()), " already has a split stream"));
  }
  auto hop = hops_.find(open.client_id());
  if (hop != hops_.end() && hop->second.has_downstream()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "task ", Printable(open.task_id()), " holds a chain's stages [", hop->second.begin(), ", ",
        st->second.cut, "): it streams to ", Printable(hop->second.downstream().name()), ", not to the server"));
  }
  st->second.open = true;
  const FederationConfig& cfg = ctx_.config();
  SplitStreamTask task;
  task.client_id = open.client_id();
  task.task_id = open.task_id();
  task.round = round_;
  // A chain's last device passes on what its data owner keeps in flight.
  task.window = mode_ == SplitMode::kPipeline ? std::max(cfg.split.window, cfg.split.micro_batches)
                                              : cfg.split.window;
  task.act_codec = SplitTensorCodec(cfg.compression.activations);
  task.grad_codec = SplitTensorCodec(cfg.compression.gradients);
  task.max_elements = cfg.server.max_model_elements;
  if (cfg.split.record > 0) {
    task.record = cfg.split.record;
    task.record_path = ctx_.RunPath(absl::StrCat("record/round-", ctx_.CurrentRoundLocked(), "/", open.client_id(), ".pb"));
  }
  return task;
}

void SplitDriver::EndedLocked(const SplitStreamTask& task, const Status& why) {
  TaskMap& tasks = ctx_.TasksLocked();
  auto t = tasks.find(task.task_id);
  if (t == tasks.end() || t->second.client_id != task.client_id || task.round != round_ ||
      t->second.state != TaskState::kAssigned) {
    return;
  }
  ctx_.FailTaskLocked(t->first, t->second, absl::StrCat("split stream: ", why.ToString()));
  ctx_.Wake();
}

}  // namespace cleave
