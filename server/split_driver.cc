#include "server/split_driver.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "compression/codec.h"
#include "core/printable.h"
#include "models/part.h"

namespace cleave {

Status SplitDriver::Init(const ModelSpec& spec) {
  ASSIGN_OR_RETURN(mode_, ParseSplitMode(c_.cfg_.split.mode));
  const JobConfig& cfg = c_.cfg_;
  num_stages_ = c_.model_->num_stages();
  tail_begin_ = mode_ == SplitMode::kUShaped ? num_stages_ - cfg.split.tail : num_stages_;
  if (tail_begin_ < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", cfg.model.name, " has ", num_stages_, " stages: too few to cut",
        mode_ == SplitMode::kUShaped ? absl::StrCat(" with split.tail ", cfg.split.tail) : ""));
  }
  if (cfg.split.cut >= tail_begin_) {
    return absl::InvalidArgumentError(absl::StrCat("split.cut ", cfg.split.cut, " is not in [1, ",
                                                   tail_begin_ - 1, "] for model ",
                                                   cfg.model.name));
  }
  // A language model reads model.gpt.context token ids and predicts one of vocab.
  const bool text = spec.name == "gpt";
  const std::vector<int64_t> sample = text ? std::vector<int64_t>{spec.gpt.context} : spec.input_shape;
  num_classes_ = text ? static_cast<int>(spec.gpt.vocab) : spec.num_classes;
  ASSIGN_OR_RETURN(server_profile_, ProfileStages(spec, sample, cfg.train.batch_size, 3));
  stage_shapes_ = {sample};
  for (const auto& p : server_profile_) stage_shapes_.push_back(p.out_shape);
  // What the cost model needs from the model and this server; ProblemFor adds a client.
  model_problem_ = ModelCutProblem(server_profile_, sample, cfg.train, cfg.split.window);
  CutProblem& p = model_problem_;
  // Tensors travel in chunks (proto/split_chunks.h): a micro-batch is bounded by the
  // largest tensor the server takes, not by a message.
  p.max_message_bytes = 4 * cfg.server.max_model_elements;
  p.tail_begin = mode_ == SplitMode::kUShaped ? tail_begin_ : -1;
  auto factor = [](const std::string& codec_spec) {  // encoded / float32 bytes
    auto codec = MakeStatelessCodec(codec_spec, 0);
    return codec.ok() && *codec ? (*codec)->EncodedSize({1 << 20}) / double{4 << 20} : 1.0;
  };
  p.activation_bytes_factor = factor(cfg.compression.activations);
  p.gradient_bytes_factor = factor(cfg.compression.gradients);
  if (cfg.split.cut > 0) {  // a fixed cut must let a micro-batch through one message
    const CutPrediction r = PredictStep(p, cfg.split.cut);
    if (!r.fits) {
      return absl::InvalidArgumentError(absl::StrCat("split.cut ", cfg.split.cut, ": ", r.why_not,
                                                     "; lower train.batch_size or cut deeper"));
    }
  }
  auto probe = std::make_shared<const std::string>(RandomHex(Coordinator::kProbeBytes / 2));
  probe_digest_ = Sha256Hex(*probe);
  c_.blobs_[probe_digest_] = probe;
  c_.pinned_blobs_.insert(probe_digest_);
  spdlog::info("split learning: {}, {} stages, cut {}, window {}", cfg.split.mode, num_stages_,
               cfg.split.cut ? std::to_string(cfg.split.cut) : "auto", cfg.split.window);
  return absl::OkStatus();
}

CutProblem SplitDriver::ProblemFor(const Session& s, int clients_in_round) const {
  CutProblem p = model_problem_;
  p.client_stage_s.assign(s.profile.stage_seconds().begin(), s.profile.stage_seconds().end());
  // One shared server part runs one step at a time; per-client copies share the pool.
  p.server_load = mode_ == SplitMode::kSflV1
                      ? std::max(1.0, static_cast<double>(clients_in_round) /
                                          c_.cfg_.server.worker_threads)
                      : clients_in_round;
  p.up_bps = s.profile.uplink_bytes_per_s();
  p.down_bps = s.profile.downlink_bytes_per_s();
  p.rtt_s = s.profile.rtt_s();
  p.memory_limit_bytes = s.profile.memory_limit_bytes();
  return p;
}

Status SplitDriver::BeginLocked(int64_t round, const FitSettings& fit,
                                std::vector<std::string>* clients) {
  part_blobs_.clear();
  closed_.reset();
  std::map<std::string, int> cuts;
  std::vector<std::string> chosen;
  // In sl the clients take turns, one at a time, so the server serves one at a time.
  const int concurrent = mode_ == SplitMode::kSl ? 1 : static_cast<int>(clients->size());
  for (const auto& cid : *clients) {
    Session& s = c_.sessions_[cid];
    if (!s.has_profile) {  // a fixed cut needs no profile
      cuts[cid] = c_.cfg_.split.cut;
      chosen.push_back(cid);
      continue;
    }
    auto policy = c_.cfg_.split.cut ? MakeFixedPolicy(c_.cfg_.split.cut) : MakeCostModelPolicy();
    auto choice = policy->Choose(s.feedback.Apply(ProblemFor(s, concurrent)));
    if (!choice.ok()) {
      spdlog::warn("round {}: client {} ({}) left out: {}", round, cid, s.name,
                   std::string(choice.status().message()));
      continue;
    }
    s.prediction = *choice;
    cuts[cid] = choice->cut;
    chosen.push_back(cid);
    spdlog::info("round {}: client {} ({}) cut at {} by {}: predicted step {:.1f} ms (client "
                 "{:.1f}, up {:.1f}, server {:.1f}, down {:.1f}), client memory {} KiB",
                 round, cid, s.name, choice->cut, policy->name(), 1e3 * choice->step_s,
                 1e3 * choice->client_s, 1e3 * choice->up_s, 1e3 * choice->server_s,
                 1e3 * choice->down_s, choice->client_memory_bytes >> 10);
  }
  if (chosen.empty()) return absl::AbortedError(absl::StrCat("round ", round, ": no client to cut for"));
  SplitRoundOptions o;
  o.mode = mode_;
  o.model = c_.model_spec_;
  o.training = LocalTrainOptions(fit, c_.cfg_.run.seed);
  o.num_stages = num_stages_;
  o.tail_begin = tail_begin_;
  o.max_batch = fit.batch_size;
  o.num_classes = num_classes_;
  o.stage_input_shapes = stage_shapes_;
  ASSIGN_OR_RETURN(round_, SplitRound::Create(std::move(o), c_.global_, cuts));
  *clients = std::move(chosen);
  return absl::OkStatus();
}

void SplitDriver::PrepareTaskLocked(v1::Task* task, TaskRecord* rec) {
  // The client part, published as a blob of its own. Parts at the same cut are the same
  // tensors, so the round builds, encodes and hashes each cut's once (in sl each turn has
  // its own: the clients before it changed it).
  rec->split = true;
  rec->cut = *round_->CutOf(rec->client_id);
  PartBlob turn;
  PartBlob& pb = mode_ == SplitMode::kSl ? turn : part_blobs_[rec->cut];
  const std::vector<std::string>& frozen = c_.frozen_;
  if (!pb.part) {
    ParameterSet part = *round_->ClientPart(rec->client_id);
    // LoRA: the part's adapters travel (down and up); its frozen tensors come from a base
    // of the part's own frozen tensors (the same every round: pinned), which the client
    // fetches once per cut.
    if (!frozen.empty()) {
      auto& base = cut_bases_[rec->cut];
      if (base.first.empty()) {
        auto blob = std::make_shared<const std::string>(Only(part, frozen).Encode());
        base = {Sha256Hex(*blob), static_cast<int64_t>(blob->size())};
        c_.blobs_[base.first] = std::move(blob);
        c_.pinned_blobs_.insert(base.first);
      }
      part = Without(part, frozen);
    }
    auto blob = std::make_shared<const std::string>(c_.ModelBlob(part));
    pb.digest = Sha256Hex(*blob);
    pb.size = static_cast<int64_t>(blob->size());
    c_.blobs_[pb.digest] = std::move(blob);
    c_.fp32_sizes_[pb.digest] = static_cast<int64_t>(part.EncodedSize());
    pb.part = std::make_shared<const ParameterSet>(std::move(part));
  }
  rec->part = pb.part;
  task->clear_base_digest();
  task->clear_base_size();
  if (!frozen.empty()) {
    task->set_base_digest(cut_bases_[rec->cut].first);
    task->set_base_size(cut_bases_[rec->cut].second);
  }
  task->set_model_digest(pb.digest);
  task->set_model_size(pb.size);
  rec->expected_size = c_.update_codec_ ? EncodedTensorsSize(*c_.update_codec_, *rec->part)
                                        : static_cast<int64_t>(rec->part->EncodedSize());
  const JobConfig& cfg = c_.cfg_;
  auto* st = task->mutable_split();
  st->set_mode(cfg.split.mode);
  st->set_cut(rec->cut);
  st->set_tail_begin(tail_begin_);
  st->set_num_stages(num_stages_);
  st->set_window(cfg.split.window);
  st->set_activation_codec(Coordinator::SplitCodec(cfg.compression.activations));
  st->set_gradient_codec(Coordinator::SplitCodec(cfg.compression.gradients));
  st->set_activation_noise(cfg.split.activation_noise);
  st->set_nopeek(cfg.split.nopeek);
}

RoundDriver::AddUpload SplitDriver::ClaimUploadLocked(const TaskRecord& t) {
  // The client's trained part: the part it was given plus its delta (with LoRA, the
  // adapters; the frozen tensors are as the round started). Added into the split round
  // under its own lock.
  return [this, round = round_, part = t.part, client = t.client_id](
             const std::vector<TensorView>& delta, int64_t weight) -> Status {
    ParameterSet trained = *part;
    for (size_t i = 0; i < delta.size(); ++i) {
      auto& v = trained.mutable_tensors()[i].values;
      std::vector<float> d(v.size());
      delta[i].Read(0, delta[i].numel, d.data());
      for (size_t j = 0; j < v.size(); ++j) v[j] += d[j];
    }
    if (!c_.frozen_.empty()) {
      ASSIGN_OR_RETURN(ParameterSet whole, round->ClientPart(client));
      RETURN_IF_ERROR(Overwrite(trained, &whole));
      trained = std::move(whole);
    }
    return round->Finish(client, trained, weight);
  };
}

void SplitDriver::CloseLocked(int64_t round, RoundMetrics* m) {
  m->split = true;
  m->activation_bytes_up = c_.split_up_;
  m->gradient_bytes_down = c_.split_down_;
  m->labels_up = c_.labels_up_;
  for (const auto& [id, t] : c_.tasks_) {
    if (!t.split) continue;
    auto s = c_.sessions_.find(t.client_id);
    const std::string name = s != c_.sessions_.end() ? s->second.name : t.client_id;
    m->cuts[name] = t.cut;
    if (t.state != TaskState::kDone) continue;
    m->step_s += t.stats.wall_s();
    m->client_compute_s += t.stats.client_compute_s();
    m->transfer_s += t.stats.transfer_s();
    m->server_compute_s += t.stats.server_compute_s();
    if (s != c_.sessions_.end() && s->second.prediction.cut == t.cut) {
      Session& session = s->second;
      spdlog::info("round {}: client {} at cut {}: predicted step {:.1f} ms, measured {:.1f} ms "
                   "(client {:.1f}, transfer {:.1f}, server {:.1f})",
                   round, name, t.cut, 1e3 * session.prediction.step_s, 1e3 * t.stats.wall_s(),
                   1e3 * t.stats.client_compute_s(), 1e3 * t.stats.transfer_s(),
                   1e3 * t.stats.server_compute_s());
      session.feedback.Observe(session.prediction, t.stats.client_compute_s(),
                               t.stats.transfer_s(), t.stats.server_compute_s());
    }
  }
  if (round_) {
    const SplitRound::Load load = round_->ServerLoad();
    m->server_busy = load.span_s > 0 ? load.busy_s / load.span_s : 0;
  }
  if (m->participants > 0) {
    m->step_s /= m->participants;
    m->client_compute_s /= m->participants;
    m->transfer_s /= m->participants;
    m->server_compute_s /= m->participants;
  }
  closed_ = std::move(round_);
}

Status SplitDriver::Fold(const ParameterSet& start, int64_t /*weight*/) {
  const std::shared_ptr<SplitRound> round = std::move(closed_);
  if (!round) return absl::InternalError("split learning: no closed round to aggregate");
  ASSIGN_OR_RETURN(ParameterSet mean, round->Aggregate());
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
  c_.AccumulateUnnamed(ViewsOf(delta), 1);
  return absl::OkStatus();
}

StatusOr<SplitStreamTask> SplitDriver::OpenLocked(const v1::SplitOpen& open) {
  auto t = c_.tasks_.find(open.task_id());
  if (t == c_.tasks_.end() || t->second.client_id != open.client_id() || !t->second.split) {
    return absl::FailedPreconditionError(absl::StrCat("no split task ", Printable(open.task_id()),
                                                      " for client ", Printable(open.client_id())));
  }
  if (t->second.state != TaskState::kAssigned) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", Printable(open.task_id()), " is over"));
  }
  if (t->second.split_open) {
    return absl::AlreadyExistsError(
        absl::StrCat("task ", Printable(open.task_id()), " already has a split stream"));
  }
  t->second.split_open = true;
  SplitStreamTask task;
  task.client_id = open.client_id();
  task.task_id = open.task_id();
  task.round = round_;
  task.window = c_.cfg_.split.window;
  task.act_codec = Coordinator::SplitCodec(c_.cfg_.compression.activations);
  task.grad_codec = Coordinator::SplitCodec(c_.cfg_.compression.gradients);
  task.max_elements = c_.cfg_.server.max_model_elements;
  return task;
}

void SplitDriver::EndedLocked(const SplitStreamTask& task, const Status& why) {
  auto t = c_.tasks_.find(task.task_id);
  if (t == c_.tasks_.end() || t->second.client_id != task.client_id || task.round != round_ ||
      t->second.state != TaskState::kAssigned) {
    return;
  }
  c_.FailTaskLocked(t->first, t->second, absl::StrCat("split stream: ", why.ToString()));
  c_.cv_.SignalAll();
}

}  // namespace cleave
