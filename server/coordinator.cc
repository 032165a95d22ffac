#include "server/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/files.h"
#include "models/hf_folder.h"
#include "models/kinds.h"
#include "models/safetensors.h"
#include "server/modes/secagg_driver.h"
#include "server/modes/split_driver.h"
#include "server/observe/metrics_json.h"
#include "server/rounds/round_registry.h"
#include "server/rounds/scheduler.h"

namespace cleave {

// ---------------------------------------------------------------------------------
// Setup, rounds, checkpoints.

Status Coordinator::Init() {
  MutexLock l(&mu_);  // nothing else runs yet; the annotations still hold
  RETURN_IF_ERROR(machinery_.Choose(config()));
  ASSIGN_OR_RETURN(const ModelSpec spec, LoadModelLocked());
  RETURN_IF_ERROR(SplitLayoutLocked());
  RETURN_IF_ERROR(LoadDataLocked(spec));
  const StrategyJob strategy_job = StrategyJobOf(config());
  ASSIGN_OR_RETURN(std::unique_ptr<Strategy> strategy,
                   opts_.strategy ? opts_.strategy(strategy_job) : CreateStrategy(strategy_job));
  strategy_.Set(std::move(strategy));
  RETURN_IF_ERROR(MakeCodecs());
  if (SplitStreams* split = machinery_.split()) {
    split->mu().AssertHeld();  // this->mu_
    RETURN_IF_ERROR(split->InitLocked(spec, *eval_.model));
  }
  RETURN_IF_ERROR(machinery_.mode().PrepareLocked());
  if (NeedProfile()) {  // what profiling clients time their downlink with
    auto probe = std::make_shared<const std::string>(RandomHex(kProbeBytes / 2));
    assets_.probe = blobs_.Pin(std::move(probe));
  }
  log_.Begin(absl::StrCat(config().run.name, "-", RandomHex(4)), 0);
  if (!opts_.run_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opts_.run_dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", opts_.run_dir, ": ", ec.message()));
    RETURN_IF_ERROR(LoadCheckpoint());
    if (!opts_.config_text.empty()) {
      RETURN_IF_ERROR(WriteFileAtomic(Path("config.yaml"), opts_.config_text));
    }
    // Held open from now on, so that running out of descriptors (connections) cannot
    // stop a round from being recorded.
    ASSIGN_OR_RETURN(run_files_, RunFiles::Open(opts_.run_dir, "metrics.jsonl", "checkpoint.pb"));
    RETURN_IF_ERROR(machinery_.scheduler().Resume(opts_.run_dir, global_.round));
  }
  PublishModelLocked();
  return absl::OkStatus();
}

StatusOr<ModelSpec> Coordinator::LoadModelLocked() {
  ModelSpec spec = ModelSpecOf(config().model, config().run.seed);
  const ModelTraits kind = ModelTraitsOf(config().model.name);
  if (kind.scripted) {
    ASSIGN_OR_RETURN(spec.torchscript, ReadFile(config().model.path));
    auto blob = std::make_shared<const std::string>(spec.torchscript);
    const BlobRef script = blobs_.Pin(std::move(blob));
    assets_.model.set_torchscript_digest(script.digest);
    assets_.model.set_torchscript_size(script.size);
  }
  if (kind.hf_folder) {
    ASSIGN_OR_RETURN(std::string hf_config, ReadHfConfig(config().model.path));
    RETURN_IF_ERROR(SetHfModel(spec, std::move(hf_config), config().model.path + "/config.json"));
    if (Status s = CheckHfBeforeBuilding(config().model.path, spec.hf_config, config().model.weights.empty()); !s.ok()) {
      return Status(s.code(), absl::StrCat("model.path: ", s.message()));
    }
    if (config().split.enabled() && spec.gpt.tie && !spec.lora.enabled()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.path: ", config().model.path, "/config.json ties the head to the embedding "
          "(tie_word_embeddings), which split learning places on two sides of the cut: "
          "train LoRA adapters (model.lora.rank), which leave the shared weight frozen"));
    }
  }
  DescribeModelLocked(spec);
  model_.spec = spec;
  ModelSpec build = spec;  // the folder's weights are read into it next: none drawn
  build.weights_follow = kind.hf_folder && config().model.weights.empty();
  auto model = Model::Create(build);
  if (!model.ok()) return absl::InvalidArgumentError(absl::StrCat("model: ", model.status().message()));
  eval_.model = *std::move(model);
  global_.weights = eval_.model->Parameters();
  if (kind.hf_folder && config().model.weights.empty()) {
    // Read straight into the global model's own tensors (LoRA adapters keep their
    // initial values): no second copy of the weights while they load.
    if (Status s = LoadHfInto(config().model.path, HfTargetsOf(global_.weights), spec.gpt.layers); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("model.path: ", s.message()));
    }
    if (!spec.quantize.empty()) {
      auto quantized = LoadHfQuantized(config().model.path, eval_.model->QuantizedBase(), spec.gpt.layers);
      if (!quantized.ok()) return absl::InvalidArgumentError(absl::StrCat("model.path: ", quantized.status().message()));
      RETURN_IF_ERROR(eval_.model->LoadQuantized(*quantized));
      model_.quantized_base = *std::move(quantized);
      auto blob = std::make_shared<const std::string>(model_.quantized_base.Encode());
      assets_.quantized_base = blobs_.Pin(std::move(blob));
      spdlog::info("quantized base: {} projection weights in {}, {} bytes", model_.quantized_base.tensors.size(),
                   spec.quantize, assets_.quantized_base.size);
    }
  } else if (!config().model.weights.empty()) {
    auto weights = LoadWeights(config().model.weights, config().model.name, global_.weights);
    if (!weights.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("model.weights: ", weights.status().message()));
    }
    global_.weights = *std::move(weights);
  }
  if (ScriptedLoss(config().train.loss)) {  // sent to clients as a blob, like a model archive
    ASSIGN_OR_RETURN(std::string archive, ReadFile(config().train.loss_path));
    if (Status s = eval_.model->SetTorchScriptLoss(archive); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("train.loss_path: ", s.message()));
    }
    auto blob = std::make_shared<const std::string>(std::move(archive));
    assets_.loss = blobs_.Pin(std::move(blob));
  }
  if (opts_.initial_model) {
    if (opts_.evaluate && !opts_.initial_model->SameLayout(global_.weights)) {
      return absl::InvalidArgumentError("initial_model does not match the model's layout");
    }
    global_.weights = *opts_.initial_model;
  }
  return spec;
}

void Coordinator::DescribeModelLocked(const ModelSpec& spec) {
  assets_.model.set_name(config().model.name);
  for (int64_t d : spec.input_shape) assets_.model.add_input_shape(d);
  assets_.model.set_num_classes(spec.num_classes);
  if (ModelTraitsOf(spec.name).hf_folder) assets_.model.set_hf_config(spec.hf_config);
  assets_.model.set_quantize(spec.quantize);
  assets_.model.set_static_batch_norm(spec.static_bn);
  if (spec.text()) {
    v1::GptDescription* g = assets_.model.mutable_gpt();
    g->set_vocab(spec.gpt.vocab);
    g->set_context(spec.gpt.context);
    g->set_layers(spec.gpt.layers);
    g->set_heads(spec.gpt.heads);
    g->set_dim(spec.gpt.dim);
    g->set_tie(spec.gpt.tie);
  }
  if (!spec.interop_base.empty()) {
    assets_.model.mutable_interop()->set_base(spec.interop_base);
    assets_.model.mutable_interop()->set_width(spec.interop_width);
  }
  if (spec.lora.enabled()) {
    v1::LoraDescription* l = assets_.model.mutable_lora();
    l->set_rank(spec.lora.rank);
    l->set_alpha(spec.lora.alpha);
    for (const std::string& t : spec.lora.targets) l->add_targets(t);
    l->set_dropout(spec.lora.dropout);
  }
}

Status Coordinator::SplitLayoutLocked() {
  std::vector<std::string> personal;
  if (!config().model.personal.empty()) {
    auto matched = MatchTensorNames(global_.weights, config().model.personal);
    if (!matched.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("model.personal: ", matched.status().message()));
    }
    personal = *std::move(matched);
  }
  const ModelTraits kind = ModelTraitsOf(config().model.name);
  ASSIGN_OR_RETURN(model_.layout, ModelLayout::Of(global_.weights, std::move(personal), eval_.model->FrozenTensors(), kind.private_tensor));
  if (!model_.layout.personal().empty()) {
    for (const std::string& n : model_.layout.personal()) assets_.model.add_personal(n);
    spdlog::info("personal layers: {} of {} tensors stay on the clients ({})", model_.layout.personal().size(),
                 global_.weights.size(), absl::StrJoin(model_.layout.personal(), " "));
  }
  if (const std::vector<std::string>& frozen = model_.layout.frozen(); !frozen.empty()) {
    auto base = std::make_shared<const std::string>(Only(global_.weights, frozen).Encode());
    assets_.base = blobs_.Pin(std::move(base));
    const ParameterSet trained = Without(global_.weights, frozen);
    spdlog::info("LoRA: {} adapter tensors ({} values, {:.2f} % of the model) train; {} are "
                 "frozen ({} bytes, sent once in federated rounds)",
                 trained.size(), trained.total_elements(),
                 100.0 * trained.total_elements() / global_.weights.total_elements(), frozen.size(),
                 assets_.base.size);
  }
  if (kind.has_private_tensors()) {  // the devices' own bases and fusion layers (interop)
    ParameterSet scratch;
    const ParameterSet& shared = model_.layout.Published(global_.weights, scratch);
    spdlog::info("interoperable architectures: the shared block ({} tensors, {} values) is federated; each "
                 "device keeps its own base and fusion layer",
                 shared.size(), shared.total_elements());
  }
  return absl::OkStatus();
}

Status Coordinator::LoadDataLocked(const ModelSpec& spec) {
  if (opts_.evaluate) {
    auto test = LoadDataSpec(config().data.test, /*train=*/false);
    if (!test.ok()) return absl::InvalidArgumentError(absl::StrCat("data.test: ", test.status().message()));
    eval_.test = *std::move(test);
    RETURN_IF_ERROR(CheckDataFitsModel(eval_.test, spec, config().train.loss, "data.test"));
    if (config().data.test_limit > 0 && config().data.test_limit < eval_.test.size) {
      std::vector<int64_t> idx(config().data.test_limit);
      for (int64_t i = 0; i < config().data.test_limit; ++i) idx[i] = i;
      eval_.test = eval_.test.Subset(idx);
    }
  }
  if (config().aggregation.rule == "fltrust") {
    auto root = LoadDataSpec(config().aggregation.root_data, /*train=*/true);
    if (!root.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("aggregation.root_data: ", root.status().message()));
    }
    eval_.root = *std::move(root);
    RETURN_IF_ERROR(CheckDataFitsModel(eval_.root, spec, config().train.loss, "aggregation.root_data"));
  }
  return absl::OkStatus();
}

Status Coordinator::MakeCodecs() {
  if (CodecFamily(config().compression.update) != "none") {
    auto codec = MakeCodec(config().compression.update);
    if (!codec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("compression.update: ", codec.status().message()));
    }
    codecs_.update = *std::move(codec);
  }
  if (auto c = MakeStatelessCodec(config().compression.broadcast, config().run.seed); !c.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("compression.broadcast: ", c.status().message()));
  } else {
    codecs_.broadcast = *std::move(c);
  }
  for (const auto& [key, codec] : {std::pair{"activations", config().compression.activations},
                                   std::pair{"gradients", config().compression.gradients}}) {
    if (auto c = MakeStatelessCodec(codec, 0); !c.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("compression.", key, ": ", c.status().message()));
    }
  }
  return absl::OkStatus();
}

StatusOr<int64_t> Coordinator::WaitForClients() {
  MutexLock l(&mu_);
  RETURN_IF_ERROR(AwaitClientsLocked());
  int64_t examples = 0;
  for (const auto& cid : AvailableLocked()) examples += sessions_.Find(cid)->num_examples;
  phase_ = "idle";
  return examples;
}

StatusOr<EdgeRound> Coordinator::RunEdgeRound(const ParameterSet& start, const FitSettings& fit,
                                              uint64_t seed) {
  UseTorchThreads();  // called on the upstream client's thread
  StatusOr<RoundMetrics> m;
  {
    MutexLock l(&mu_);
    if (!model_.layout.updates_all()) {
      return absl::FailedPreconditionError(
          "an edge aggregator's model has no personal or frozen tensors");
    }
    if (!start.SameLayout(global_.weights)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the upstream's model has another layout than this server's model.name=",
          config().model.name));
    }
    RETURN_IF_ERROR(CheckViews(start, ViewsOf(start)));
    global_.weights = start;
    PublishModelLocked();
    edge_ = EdgeTask{fit, seed};
    SyncRounds& rounds = machinery_.rounds();
    rounds.mu().AssertHeld();  // this->mu_
    m = rounds.NextLocked();
    edge_.reset();
  }
  buffers_.Drop();
  RETURN_IF_ERROR(m.status());
  RETURN_IF_ERROR(Commit(&*m));
  EdgeRound r;
  r.delta = GlobalModel();
  for (size_t i = 0; i < r.delta.size(); ++i) {
    auto& v = r.delta.mutable_tensors()[i].values;
    const auto& s = start.tensors()[i].values;
    for (size_t j = 0; j < v.size(); ++j) v[j] -= s[j];
  }
  r.examples = m->examples;
  r.weights = machinery_.mode().ElementWeights();
  r.metrics = *std::move(m);
  return r;
}

void Coordinator::FinalEvaluation(double elapsed_s) {
  StatusOr<RoundMetrics> m;
  {
    MutexLock l(&mu_);
    // Not in split rounds nor under secure aggregation: clients report no evaluation
    // there (one client's numbers would show what masking hides).
    // A run restarted after its final evaluation does not repeat it.
    if (!config().server.final_evaluation || !log_.clients_evaluate() || !machinery_.mode().ClientsEvaluate() ||
        stopping_ || log_.final_evaluated_round() == global_.round) {
      return;
    }
    spdlog::info("final evaluation of round {}'s model by the clients", global_.round);
    SyncRounds& rounds = machinery_.rounds();
    rounds.mu().AssertHeld();  // this->mu_
    m = rounds.EvaluateLocked();
  }
  if (!m.ok()) {
    spdlog::warn("final evaluation: {}", std::string(m.status().message()));
    return;
  }
  m->elapsed_s = elapsed_s;
  spdlog::info("final evaluation: accuracy {:.4f}, loss {:.4f} on {} examples of {} clients",
               m->client_eval.accuracy, m->client_eval.loss, m->client_eval.examples,
               m->client_eval.clients);
  {
    MutexLock l(&mu_);
    traffic_.Commit(m->bytes_up, m->bytes_down);
    log_.Add(*m);
  }
  if (opts_.run_dir.empty()) return;
  if (Status s = run_files_->AppendLog(RoundMetricsJson(*m).dump()); !s.ok()) {
    spdlog::warn("final evaluation not recorded: {}", std::string(s.message()));
  }
}

Status Coordinator::Commit(RoundMetrics* m) {
  // Called without mu_ held: evaluation and disk writes take a while, and the transport must
  // not wait for them.
  if (opts_.evaluate) {
    RETURN_IF_ERROR(eval_.model->SetParameters(GlobalModel()));
    ASSIGN_OR_RETURN(EvalStats ev, eval_.model->Evaluate(eval_.test, config().server.eval_batch_size, config().train.loss));
    m->evaluated = true;
    m->test_accuracy = ev.accuracy;
    m->test_loss = ev.loss;
    m->test_metrics = ev.metrics;
    m->test_per_class_accuracy = ev.per_class_accuracy;
  }
  std::string checkpoint;
  {
    MutexLock l(&mu_);
    traffic_.Commit(m->bytes_up, m->bytes_down);
    log_.Add(*m);
    if (!opts_.run_dir.empty()) checkpoint = CheckpointLocked(m->elapsed_s);
  }
  if (opts_.run_dir.empty()) return absl::OkStatus();
  // Metrics first: on resume, lines of rounds after the checkpoint are dropped.
  RETURN_IF_ERROR(run_files_->AppendLog(RoundMetricsJson(*m).dump()));
  return run_files_->ReplaceState(checkpoint);
}

std::string Coordinator::CheckpointLocked(double elapsed_s) const {
  Checkpoint ck;
  ck.run_id = log_.run_id();
  ck.round = global_.round;
  ParameterSet scratch;
  ck.global = Published(global_.weights, scratch);  // exact, whatever the broadcast codec
  ck.strategy_state = strategy_.State();  // async: uploads go on into the next buffer
  ck.rng = rng_;
  ck.bytes_up = traffic_.run_up();
  ck.bytes_down = traffic_.run_down();
  ck.wall_s = elapsed_s;
  if (ClientSelector* selector = machinery_.rounds().selector()) ck.oort = selector->Checkpoint();
  return EncodeCheckpoint(ck);
}

Status Coordinator::LoadCheckpoint() {
  const std::string path = Path("checkpoint.pb");
  if (!std::filesystem::exists(path)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  // Every error names the file: the operator must know what to inspect or remove.
  auto in_file = [&](const Status& s) {
    return Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  auto decoded = DecodeCheckpoint(bytes);
  if (!decoded.ok()) return in_file(decoded.status());
  Checkpoint& ck = *decoded;
  ParameterSet scratch;
  if (!ck.global.SameLayout(Published(global_.weights, scratch))) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " holds a model of another layout than model.name=", config().model.name,
                     model_.layout.frozen().empty() ? "" : " with these LoRA adapters"));
  }
  if (Status s = strategy_.get().Restore(ck.strategy_state); !s.ok()) return in_file(s);
  if (model_.layout.publishes_all()) {
    global_.weights = std::move(ck.global);
  } else {
    RETURN_IF_ERROR(in_file(Overwrite(ck.global, &global_.weights)));  // the adapters on the base
  }
  rng_ = ck.rng;
  log_.Begin(ck.run_id, ck.wall_s);
  global_.round = ck.round;
  traffic_.RestoreRun(ck.bytes_up, ck.bytes_down);
  if (ClientSelector* selector = machinery_.rounds().selector(); selector && ck.oort) {
    selector->Resume(std::move(*ck.oort));
  }
  spdlog::info("resuming run {} after round {}", log_.run_id(), global_.round);
  return log_.Resume(Path("metrics.jsonl"), global_.round);
}

Status Coordinator::Run() {
  UseTorchThreads();  // Run may be called on any thread
  const auto start = clock_->Now();
  const double before = [&] {  // a resumed run's time before this process
    MutexLock l(&mu_);
    return log_.prior_elapsed_s();
  }();
  auto elapsed = [&] { return before + std::chrono::duration<double>(clock_->Now() - start).count(); };
  if (committed_round() == 0 && opts_.evaluate) {  // baseline: the initial model
    RoundMetrics m0;
    RETURN_IF_ERROR(eval_.model->SetParameters(GlobalModel()));
    ASSIGN_OR_RETURN(EvalStats ev,
                     eval_.model->Evaluate(eval_.test, config().server.eval_batch_size, config().train.loss));
    spdlog::info("initial model: test accuracy {:.4f}, loss {:.4f}", ev.accuracy, ev.loss);
    MutexLock l(&mu_);
    log_.set_last_accuracy(ev.accuracy);
  }
  Status result = absl::OkStatus();
  std::string stop_reason;  // a strategy's reason to end the run early
  int failed_in_a_row = 0;
  while (true) {
    StatusOr<RoundMetrics> m;
    {
      MutexLock l(&mu_);
      if (stopping_) {
        result = absl::CancelledError("stopped before the last round");
        break;
      }
      if (global_.round >= config().run.rounds) break;
      m = machinery_.scheduler().NextLocked();
    }
    buffers_.Drop();  // what late uploads of the last round returned
    if (!m.ok()) {
      if (m.status().code() == absl::StatusCode::kOutOfRange) {  // the strategy ended the run
        spdlog::info("run ends early: {}", std::string(m.status().message()));
        stop_reason = std::string(m.status().message());
        break;
      }
      if (m.status().code() == absl::StatusCode::kAborted && ++failed_in_a_row < 5) {
        spdlog::warn("{}; retrying the round", std::string(m.status().message()));
        continue;
      }
      result = m.status();
      break;
    }
    failed_in_a_row = 0;
    m->elapsed_s = elapsed();
    if (Status s = Commit(&*m); !s.ok()) {
      result = s;
      break;
    }
    machinery_.scheduler().Committed(m->round);
    spdlog::info(
        "round {} committed: accuracy {:.4f}, test loss {:.4f}, train loss {:.4f}, "
        "{} participants, {} failures, {} B up, {} B down, {:.1f}s",
        m->round, m->test_accuracy, m->test_loss, m->train_loss, m->participants, m->failures,
        m->bytes_up, m->bytes_down, m->wall_s);
    if (opts_.committed) opts_.committed(*m);
    if (const double target = config().run.target_accuracy;
        target > 0 && m->evaluated && m->test_accuracy >= target) {
      stop_reason = absl::StrCat("test accuracy ", m->test_accuracy, " reached run.target_accuracy ", target);
      break;
    }
  }
  if (result.ok()) FinalEvaluation(elapsed());
  if (result.code() == absl::StatusCode::kCancelled) {
    // Stopped, not finished: a server restarted on the same run directory resumes the
    // run, so its clients should keep trying to reconnect rather than exit.
    DisconnectClients();
  } else {
    EndRun(!result.ok() ? std::string(result.message())
                        : stop_reason.empty() ? "completed"
                                              : "completed early: " + stop_reason);
  }
  return result;
}

void Coordinator::DisconnectClients() {
  std::vector<std::shared_ptr<ClientLink>> links;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    phase_ = "stopped";
    for (auto& [id, s] : sessions_) links.push_back(s.link);
  }
  for (auto& r : links) {
    r->Close(absl::UnavailableError("the server is stopping; reconnect to resume the run"));
  }
}

void Coordinator::EndRun(const std::string& reason) {
  std::vector<std::shared_ptr<ClientLink>> links;
  v1::ServerMessage msg;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    phase_ = "ended";
    for (auto& [id, s] : sessions_) links.push_back(s.link);
    msg.mutable_run_ended()->set_run_id(log_.run_id());
    msg.mutable_run_ended()->set_reason(reason);
  }
  for (auto& r : links) r->Send(msg, /*finish_after=*/true);
  // Give clients a moment to read RunEnded, then stop serving: a grace period of real
  // time for the network, not a protocol deadline.
  MutexLock l(&mu_);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!sessions_.empty() && !cv_.WaitUntil(&mu_, until)) {
  }
}

void Coordinator::Stop() {
  MutexLock l(&mu_);
  stopping_ = true;
  cv_.SignalAll();
}

Coordinator::Coordinator(ServerOptions o)
    : opts_(std::move(o)),
      strategy_(config().server.worker_threads),
      clock_(opts_.clock ? opts_.clock : Clock::Real()),
      rng_(config().run.seed),
      sessions_(config().tls.mutual),
      buffers_(config().server.worker_threads),
      uploads_(config().server.worker_threads),
      noise_(opts_.measure_update_noise && MeasuresUpdateNoise(config()) ? std::make_unique<UpdateNoiseMeter>()
                                                                         : nullptr),
      pool_(config().server.worker_threads, UseTorchThreads) {}

Coordinator::~Coordinator() { Stop(); }

ObservedState Coordinator::Observe(bool history) const {
  ObservedState o;
  {
    MutexLock l(&mu_);
    o.run_id = log_.run_id();
    o.phase = phase_;
    o.committed_round = global_.round;
    o.current_round = round_state().number;
    o.total_rounds = config().run.rounds;
    const std::vector<RoundMetrics>& rounds = log_.history();
    if (history) o.history = rounds;
    for (const auto& m : rounds) o.task_failures += m.failures;
    for (auto m = rounds.rbegin(); m != rounds.rend(); ++m) {
      if (!m->evaluation_only) {
        o.last_round = *m;
        break;
      }
    }
    std::map<std::string, TaskState> busy;  // by client: its task in flight, if any
    for (const auto& [id, t] : round_state().tasks) {
      if (t.state == TaskState::kAssigned || t.state == TaskState::kAccumulating) {
        busy[t.client_id] = t.state;
      }
    }
    const auto now = clock_->Now();
    for (const auto& [id, s] : sessions_) {
      ClientHealth c;
      c.name = s.name;
      c.id = id;
      auto b = busy.find(id);
      c.state = b != busy.end() ? (b->second == TaskState::kAccumulating ? "adding" : "training")
                : !s.unfit.empty() ? "unfit"
                                   : "idle";
      c.last_seen_s = std::chrono::duration<double>(now - s.last_seen).count();
      c.task_s = s.task_s;
      c.step_s = s.step_s;
      machinery_.mode().DescribeClientLocked(id, &c);  // split: links measured, cut
      c.done = s.done;
      c.failures = s.failures;
      o.clients.push_back(std::move(c));
    }
  }
  std::sort(o.clients.begin(), o.clients.end(),
            [](const ClientHealth& a, const ClientHealth& b) { return a.name < b.name; });
  o.bytes_up = traffic_.lifetime_up();
  o.bytes_down = traffic_.lifetime_down();
  const Server::UploadCounts u = Uploads();
  o.uploads_in_progress = u.in_progress;
  o.uploads_queued = u.queued;
  o.rss_bytes = ResidentBytes();
  o.upload_s = latency_.upload.Get();
  o.fetch_s = latency_.fetch.Get();
  o.config_yaml = opts_.config_text;
  return o;
}

std::map<std::string, double> Coordinator::ClientTaskSeconds() const {
  MutexLock l(&mu_);
  std::map<std::string, double> out;
  for (const auto& [id, s] : sessions_) {
    if (s.task_s > 0) out[s.name] = s.task_s;
  }
  return out;
}

void Coordinator::FillStatus(v1::StatusReply* reply) const {
  MutexLock l(&mu_);
  reply->set_run_id(log_.run_id());
  reply->set_round(round_state().number ? round_state().number : global_.round);
  reply->set_total_rounds(config().run.rounds);
  reply->set_connected_clients(ConnectedLocked());
  reply->set_phase(phase_);
  reply->set_last_test_accuracy(log_.last_accuracy());
}

}  // namespace cleave
