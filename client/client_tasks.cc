// Client: the task handlers (training, evaluation, split, gossip, edge), one per task
// kind (Client::Impl::TaskHandlers), and what they share.
#include "client/client_impl.h"
#include "client/pipeline_relay.h"

#include "aggregation/accumulate.h"
#include "aggregation/gossip_mix.h"
#include "core/evaluation.h"
#include "core/memory.h"
#include "models/part.h"
#include "proto/edge_weights.h"
#include "proto/train_config.h"
#include "split/cut_policy.h"
#include "split/record.h"

namespace cleave {
namespace {

// Federated evaluation's batch: small enough for a model's activations to stay in cache
// (docs/benchmarks.md, "Local training throughput").
constexpr int kEvalBatch = 256;

// The personal tensors saved in `path` ("KEY\n" then a parameter set) if they were saved
// for `key` (this run and model) and fit `global`; else none, with a warning when the
// file exists but does not fit.
ParameterSet LoadPersonal(const std::string& path, const std::string& key,
                          const std::vector<std::string>& names, const ParameterSet& global) {
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return ParameterSet();  // none saved yet
  const size_t newline = bytes->find('\n');
  if (newline == std::string::npos || bytes->compare(0, newline, key) != 0) {
    spdlog::info("{} holds personal layers of another run or model; starting afresh", path);
    return ParameterSet();
  }
  auto saved = ParameterSet::Decode(std::string_view(*bytes).substr(newline + 1));
  ParameterSet probe = global;
  Status fits = saved.ok() ? Overwrite(*saved, &probe) : saved.status();
  if (fits.ok() && saved->size() != names.size()) {
    fits = absl::InvalidArgumentError("other tensors than the model's personal ones");
  }
  if (!fits.ok()) {
    spdlog::warn("ignoring {}: {}", path, fits.ToString());
    return ParameterSet();
  }
  spdlog::info("personal layers restored from {}", path);
  return *std::move(saved);
}

// Batch order: the round's seed mixed with this client's name (stable across runs,
// unlike the id the server assigns in join order), so a seeded run repeats itself.
uint64_t BatchSeed(const v1::Task& task, const v1::Welcome& w, const std::string& name) {
  return task.train().seed() ^ std::hash<std::string>{}(name.empty() ? w.client_id() : name);
}


// Distributed DP: clips `delta` to L2 norm dp.clip, then adds this client's share of
// the noise, from a generator seeded by the OS (the server must not predict it).
void AddDpNoise(const v1::DpTask& dp, ParameterSet* delta) {
  double sq = 0;
  for (const auto& t : delta->tensors()) {
    for (float v : t.values) sq += static_cast<double>(v) * v;
  }
  const double norm = std::sqrt(sq);
  const double scale = norm > dp.clip() ? dp.clip() / norm : 1.0;
  std::mt19937_64 rng((static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}());
  std::normal_distribution<double> noise(0, dp.noise_stddev());
  for (auto& t : delta->mutable_tensors()) {
    for (float& v : t.values) v = static_cast<float>(v * scale + noise(rng));
  }
}

// trained - base, tensor by tensor (the same layout).
ParameterSet Delta(ParameterSet trained, const ParameterSet& base) {
  for (size_t i = 0; i < trained.size(); ++i) {
    auto& d = trained.mutable_tensors()[i].values;
    const auto& g = base.tensors()[i].values;
    for (size_t j = 0; j < d.size(); ++j) d[j] -= g[j];
  }
  return trained;
}

}  // namespace

StatusOr<v1::UploadReply> Client::Impl::UploadUpdate(
    v1::Coordinator::Stub* stub, const v1::Welcome& w, const v1::Task& task,
    const ParameterSet& delta, int64_t examples, double loss, double seconds,
    const v1::SplitStats* split, const v1::ClientEvaluation* evaluation,
    const v1::GossipStats* gossip) {
  const std::string& spec = task.update_codec();
  const bool fp32 = spec.empty() || CodecFamily(spec) == "none";
  v1::UploadHeader h = TaskUploadHeader(w, task, examples, fp32 ? "fp32" : spec);
  h.set_train_loss(loss);
  h.set_train_seconds(seconds);
  if (split) *h.mutable_split() = *split;
  if (evaluation) *h.mutable_evaluation() = *evaluation;
  if (gossip) *h.mutable_gossip() = *gossip;
  if (fp32) {
    return UploadPayload(stub, h, delta.Encode(), 1 << 20, 600, &emulator);
  }
  std::string key = spec;
  for (const auto& t : delta.tensors()) absl::StrAppend(&key, "|", t.name);
  if (!update_codec || key != update_codec_key) {
    ASSIGN_OR_RETURN(update_codec, MakeCodec(spec, std::hash<std::string>{}(opts.name)));
    update_codec_key = std::move(key);
  }
  return UploadPayload(stub, h, EncodeTensors(*update_codec, delta), 1 << 20, 600, &emulator);
}

Status Client::Impl::Attack(const ParameterSet& global, const LocalTrainOptions& o,
                            ParameterSet* delta) {
  const std::string& a = opts.attack;
  if (a == "sign-flip") {
    for (auto& t : delta->mutable_tensors()) {
      for (float& v : t.values) v = -v;
    }
    return absl::OkStatus();
  }
  if (a == "gaussian") {
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<float> noise(0, 1);
    for (auto& t : delta->mutable_tensors()) {
      for (float& v : t.values) v = noise(rng);
    }
    return absl::OkStatus();
  }
  if (a == "ipm") {  // our own honest update is our estimate of the benign mean
    for (auto& t : delta->mutable_tensors()) {
      for (float& v : t.values) v = -3.0f * v;
    }
    return absl::OkStatus();
  }
  // alie: mu is our honest update; sigma per coordinate is estimated from the updates of
  // 4 shards of our data (each times 4, as if trained on all of it).
  constexpr int kShards = 4;
  std::vector<std::vector<int64_t>> shards(kShards);
  for (int64_t i = 0; i < opts.train.size; ++i) shards[i % kShards].push_back(i);
  std::vector<ParameterSet> ds;
  for (const auto& idx : shards) {
    RETURN_IF_ERROR(model->SetTrainedParameters(global));
    RETURN_IF_ERROR(model->Train(opts.train.Subset(idx), o).status());
    ParameterSet d = Delta(model->TrainedParameters(), global);
    for (auto& t : d.mutable_tensors()) {
      for (float& v : t.values) v *= kShards;
    }
    ds.push_back(std::move(d));
  }
  for (size_t i = 0; i < delta->size(); ++i) {
    auto& out = delta->mutable_tensors()[i].values;
    for (size_t j = 0; j < out.size(); ++j) {
      double mean = 0, sq = 0;
      for (const auto& d : ds) mean += d.tensors()[i].values[j];
      mean /= kShards;
      for (const auto& d : ds) {
        const double x = d.tensors()[i].values[j] - mean;
        sq += x * x;
      }
      out[j] = static_cast<float>(out[j] - 1.5 * std::sqrt(sq / (kShards - 1)));
    }
  }
  return absl::OkStatus();
}

StatusOr<ModelSpec> Client::Impl::Spec(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                      const v1::ModelDescription& d) {
  ModelSpec spec;
  spec.name = d.name();
  if (d.input_shape_size() > 0) spec.input_shape.assign(d.input_shape().begin(), d.input_shape().end());
  if (d.num_classes() > 0) spec.num_classes = d.num_classes();
  if (d.has_gpt()) {
    spec.gpt = {d.gpt().vocab(), d.gpt().context(), d.gpt().layers(), d.gpt().heads(),
                d.gpt().dim(), d.gpt().tie()};
  }
  if (d.lora().rank() > 0) {
    spec.lora = {d.lora().rank(), d.lora().alpha(),
                 std::vector<std::string>(d.lora().targets().begin(), d.lora().targets().end()),
                 d.lora().dropout()};
  }
  if (spec.name == "hf") {
    RETURN_IF_ERROR(SetHfModel(spec, d.hf_config(), "the server's config.json"));
    // Refused before it is built: a model past this device's memory (or a server's
    // config.json that states a model far larger than any it could hold).
    const bool limited = opts.memory_limit_bytes > 0;
    RETURN_IF_ERROR(CheckHfModelFits(d.hf_config(), "the server's config.json",
                                     limited ? opts.memory_limit_bytes : MemoryCeilingBytes() / 2,
                                     limited ? "this device's --memory-limit-mb" : "half the memory this device may hold"));
  }
  spec.quantize = d.quantize();
  if (d.width() > 0) spec.width = d.width();
  spec.static_bn = d.static_batch_norm();
  if (d.has_interop()) {
    spec.interop_base = d.interop().base();
    spec.interop_width = d.interop().width();
  }
  if (spec.name == "torchscript") {
    if (script_digest != d.torchscript_digest()) {
      ASSIGN_OR_RETURN(script_bytes, FetchBlob(stub, w.client_id(), w.session_token(),
                                               d.torchscript_digest(), 600, &emulator));
      script_digest = d.torchscript_digest();
    }
    spec.torchscript = script_bytes;
  }
  return spec;
}

StatusOr<ParameterSet> Client::Impl::FetchModel(v1::Coordinator::Stub* stub,
                                                const v1::Welcome& w, const v1::Task& task) {
  ASSIGN_OR_RETURN(std::string blob, FetchBlob(stub, w.client_id(), w.session_token(),
                                               task.model_digest(), 600, &emulator));
  return task.model_codec().empty()
             ? ParameterSet::Decode(blob)
             : DecodeCompressedSet(blob, task.model_codec(), int64_t{1} << 31);
}

Status Client::Impl::HandleEdgeTask(const TaskCall& c) {
  v1::Coordinator::Stub* stub = c.stub;
  const v1::Welcome& w = c.w;
  const v1::Task& task = c.task;
  const NextMessage& next = c.next;
  if (task.has_split() || task.has_dp() || task.evaluate_only() ||
      !task.base_digest().empty() || task.model().personal_size() > 0) {
    return c.Reject(absl::FailedPreconditionError(
        "an edge aggregator takes whole-model federated tasks only (no split learning, "
        "distributed DP, evaluation, personal or frozen tensors)"));
  }
  if (task.model().width() > 0 && !task.update_codec().empty()) {
    return c.Reject(absl::FailedPreconditionError(absl::StrCat(
        "an edge's upload to an upstream running width-scaled submodels (its mean and each element's weight share) "
        "goes as float32, not through compression.update ", task.update_codec(), ": drop the upstream's codec")));
  }
  auto global = FetchModel(stub, w, task);
  if (!global.ok()) return c.Reject(global.status());
  c.Accept();
  // Secure aggregation upstream: this edge is one masked input among its level's, with
  // its keys agreed before its own round runs, as a client's are before it trains.
  std::optional<SecAggClient> secagg;
  if (task.has_secagg()) {
    ASSIGN_OR_RETURN(secagg, SecAggClient::Prepare(stub, w, task, next));
  }
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(ClientOptions::Aggregate r, opts.aggregate(task, *global));
  const int64_t cap = DeclaredExamples();
  if (r.examples > cap) {
    // More clients joined below since this edge joined upstream: its Join count bounds
    // what it may claim this round; then it joins again declaring the new total.
    spdlog::warn("round {}: {} examples aggregated, {} declared upstream: claiming {}, then "
                 "joining again to declare {}",
                 task.round(), r.examples, cap, cap, r.examples);
    grown_examples = r.examples;
    r.examples = cap;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Under an upstream with width-scaled submodels: the mean, then each element's share of
  // this edge's weight as NAME#weight (kEdgeWeightSuffix, proto/edge_weights.h; every
  // element held by all its devices when they train the whole model).
  if (task.model().width() > 0 && !secagg) {
    const ParameterSet mean = r.delta;
    for (size_t t = 0; t < mean.size(); ++t) {
      const Tensor& x = mean.tensors()[t];
      Tensor share{x.name + kEdgeWeightSuffix, x.shape, std::vector<float>(x.values.size(), 1.0f)};
      if (r.weights.size() > 0) {
        if (!r.weights.SameLayout(mean)) return absl::InternalError("the edge's weights are not its mean's layout");
        const auto& w = r.weights.tensors()[t].values;
        for (size_t i = 0; i < w.size(); ++i) {
          share.values[i] = r.examples > 0 ? std::min(1.0f, w[i] / static_cast<float>(r.examples)) : 0.0f;
        }
      }
      RETURN_IF_ERROR(r.delta.Add(std::move(share)));
    }
  }
  v1::UploadReply reply;
  if (secagg) {
    ASSIGN_OR_RETURN(reply, secagg->Submit(stub, w, task, r.delta, r.examples, r.examples, r.loss, seconds,
                                           &emulator, next));
  } else {
    ASSIGN_OR_RETURN(reply,
                     UploadUpdate(stub, w, task, r.delta, r.examples, r.loss, seconds, nullptr));
  }
  ++tasks_done;
  spdlog::info("round {}: edge round of {} examples in {:.1f}s (loss {:.4f}), partial mean "
               "uploaded{}{}",
               task.round(), r.examples, seconds, r.loss, secagg ? " masked" : "",
               reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

StatusOr<v1::ClientEvaluation> Client::Impl::EvaluateExternal(const v1::Task& task,
                                                              const ClientOptions::External::Global& global) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(ClientOptions::ExternalEvaluation e, opts.external.evaluate(task, global));
  if (e.examples < 0 || !std::isfinite(e.loss) || !std::isfinite(e.accuracy)) {
    return absl::InvalidArgumentError(absl::StrCat("evaluate returned ", e.examples, " examples, loss ", e.loss,
                                                   ", accuracy ", e.accuracy));
  }
  v1::ClientEvaluation evaluation;
  evaluation.set_examples(e.examples);
  evaluation.set_accuracy(e.accuracy);
  evaluation.set_loss(e.loss);
  for (const auto& [k, v] : e.metrics) {  // what the server takes; the rest stays here
    if (evaluation.metrics_size() < kMaxEvaluationMetrics && ValidEvaluationMetric(k, v)) {
      (*evaluation.mutable_metrics())[k] = v;
    }
  }
  evaluation.set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return evaluation;
}

Status Client::Impl::HandleExternalTask(const TaskCall& c) {
  const v1::Task& task = c.task;
  if (task.has_split() || task.has_gossip() || !task.base_digest().empty() || !task.quantized_base_digest().empty() ||
      task.model().personal_size() > 0 || task.model().width() > 0 || task.model().has_lora() ||
      task.model().has_interop()) {
    return c.Reject(absl::FailedPreconditionError(
        "this client trains in its own code (fit): it takes whole-model federated tasks only, not split learning, "
        "gossip, width-scaled submodels, LoRA or quantized bases, personal layers or private bases"));
  }
  if (task.evaluate_only() && !opts.external.evaluate) {
    return c.Reject(absl::FailedPreconditionError("no evaluate to run the final evaluation with"));
  }
  auto fetched = FetchModel(c.stub, c.w, task);
  if (!fetched.ok()) return c.Reject(fetched.status());
  c.Accept();
  const auto global = std::make_shared<const ParameterSet>(*std::move(fetched));
  std::optional<v1::ClientEvaluation> evaluation;
  // Federated evaluation, before training (not of a masked task: one client's numbers
  // would show what masking hides).
  if (opts.external.evaluate && (task.evaluate_only() || (!task.has_secagg() && !task.skip_evaluation()))) {
    ASSIGN_OR_RETURN(evaluation, EvaluateExternal(task, global));
  }
  if (task.evaluate_only()) return UploadFinalEvaluation(c, *evaluation, evaluation->examples());
  std::optional<SecAggClient> secagg;
  if (task.has_secagg()) {
    ASSIGN_OR_RETURN(secagg, SecAggClient::Prepare(c.stub, c.w, task, c.next));
  }
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(ClientOptions::ExternalFit fit, opts.external.fit(task, global));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (fit.examples <= 0 || !std::isfinite(fit.loss)) {
    return absl::InvalidArgumentError(absl::StrCat("fit returned ", fit.examples, " examples and loss ", fit.loss));
  }
  if (Status s = CheckViews(*global, fit.parameters); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("fit returned parameters that are not the model's: ", s.message()));
  }
  if (opts.crash_after_training && opts.crash_after_training(task.round())) {
    *c.crashed = true;
    return absl::AbortedError("simulated crash");
  }
  // The update: the returned tensors, read where they are, less the global model.
  ParameterSet delta = global->ZerosLike();
  AddScaled(fit.parameters, 1.0f, &delta);
  AddScaled(ViewsOf(*global), -1.0f, &delta);
  fit.keep.reset();
  const TrainStats stats{fit.loss, opts.count_from_fit ? fit.examples : std::min(fit.examples, DeclaredExamples()),
                         seconds};
  RecordTraining(stats);
  ASSIGN_OR_RETURN(v1::UploadReply reply,
                   UploadTrained(c, secagg, std::move(delta), stats, evaluation ? &*evaluation : nullptr));
  ++tasks_done;
  spdlog::info("round {}: fit trained {} examples in {:.2f}s (loss {:.4f}), update uploaded{}", task.round(),
               stats.examples, seconds, fit.loss, reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

StatusOr<v1::UploadReply> Client::Impl::UploadTrained(const TaskCall& c, std::optional<SecAggClient>& secagg,
                                                      ParameterSet delta, const TrainStats& stats,
                                                      const v1::ClientEvaluation* evaluation) {
  if (secagg) {
    if (c.task.has_dp()) AddDpNoise(c.task.dp(), &delta);
    return secagg->Submit(c.stub, c.w, c.task, delta, stats.examples, stats.examples, stats.loss, stats.seconds,
                          &emulator, c.next);
  }
  return UploadUpdate(c.stub, c.w, c.task, delta, stats.examples, stats.loss, stats.seconds, nullptr, evaluation);
}

Status Client::Impl::UploadFinalEvaluation(const TaskCall& c, const v1::ClientEvaluation& evaluation,
                                           int64_t examples) {
  ASSIGN_OR_RETURN(v1::UploadReply reply,
                   UploadUpdate(c.stub, c.w, c.task, ParameterSet(), examples, 0, 0, nullptr, &evaluation));
  ++tasks_done;
  spdlog::info("round {}'s model: {:.4f} accurate on {} held-out examples (final evaluation{})", c.task.round(),
               evaluation.accuracy(), evaluation.examples(), reply.duplicate() ? ", duplicate" : "");
  return absl::OkStatus();
}

Status Client::Impl::HandleExternalSplitTask(const TaskCall& c) {
  const v1::Task& task = c.task;
  const v1::SplitTask& st = task.split();
  if ((st.mode() != "sl" && st.mode() != "sfl-v1" && st.mode() != "sfl-v2") || !task.base_digest().empty() ||
      !task.quantized_base_digest().empty() || task.model().has_interop() || task.has_secagg() ||
      task.model().width() > 0 || st.label_epsilon() > 0) {
    return c.Reject(absl::FailedPreconditionError(
        "this client's stages are its own code: it takes sl, sfl-v1 and sfl-v2 tasks of a model without frozen, "
        "quantized or private tensors, not U-shaped, pipeline, submodel, masked or label-DP ones"));
  }
  auto part = FetchModel(c.stub, c.w, task);
  if (!part.ok()) return c.Reject(part.status());
  c.Accept();
  SplitTaskOptions so;
  so.seed = BatchSeed(task, c.w, opts.name);
  so.emulator = &emulator;
  so.cancel = &stop;
  so.external = opts.external.split.get();
  ASSIGN_OR_RETURN(SplitTaskResult r, RunSplitTask(c.stub, c.w, task, *part, Dataset(), so));
  const double seconds = r.stats.wall_s() * r.stats.steps();
  RecordTraining(TrainStats{r.loss, r.examples, seconds});
  ASSIGN_OR_RETURN(v1::UploadReply reply,
                   UploadUpdate(c.stub, c.w, task, Delta(r.trained, *part), r.examples, r.loss, seconds, &r.stats));
  ++tasks_done;
  spdlog::info("round {}: split task at cut {} done: {} steps, {:.1f} ms/step, loss {:.4f}{}", task.round(), st.cut(),
               r.stats.steps(), 1e3 * r.stats.wall_s(), r.loss, reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

Status Client::Impl::BuildModel(const v1::Task& task, const ModelSpec& spec) {
  const std::string key = task.model().DebugString();
  if (model && key == model_key) return absl::OkStatus();
  ASSIGN_OR_RETURN(model, Model::Create(spec));
  // Personal layers of another description do not fit (a model dropped after its last
  // task, with task slots, is rebuilt to the same one).
  if (key != model_key) personal = ParameterSet();
  model_key = key;
  loss_digest.clear();
  return absl::OkStatus();
}

std::string Client::Impl::SentPath(const v1::Task& task, const v1::Welcome& w) const {
  return absl::StrCat(opts.state_dir, "/sent/round-", task.round(), "/", w.client_id(), ".pb");
}

void Client::Impl::KeepFirstBatch(const v1::Task& task, const v1::Welcome& w, const LocalTrainOptions& o) const {
  const std::vector<int64_t> idx = FirstBatchIndices(opts.train.size, o.seed, o.batch_size);
  Activations in = InputBatch(opts.train, idx);
  SplitRecorder sent(SentPath(task, w), 1);
  sent.Add({}, 0, RecordedBatch{Tensor{"", std::move(in.shape), std::move(in.values)}, BatchLabels(opts.train, idx), {}, {}});
}

StatusOr<v1::ClientEvaluation> Client::Impl::EvaluateHoldout(const std::string& loss) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(EvalStats e, model->Evaluate(opts.holdout, kEvalBatch, loss));
  v1::ClientEvaluation evaluation;
  evaluation.set_examples(e.examples);
  evaluation.set_accuracy(e.accuracy);
  evaluation.set_loss(e.loss);
  for (const auto& [k, v] : e.metrics) (*evaluation.mutable_metrics())[k] = v;
  evaluation.set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return evaluation;
}

std::map<std::string, ParameterSet> Client::Impl::ExchangeModels(const TaskCall& c,
                                                                 const ParameterSet& mine,
                                                                 v1::GossipStats* report) {
  const v1::Task& task = c.task;
  const v1::GossipTask& g = task.gossip();
  const std::string bytes = mine.Encode();
  const double timeout_s = std::max(
      1.0, (task.deadline_unix_ms() -
            std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::system_clock::now().time_since_epoch()).count()) / 1000.0);
  const std::string& self = c.w.name();  // what the neighbours were told to expect
  std::vector<std::thread> senders;
  std::vector<Status> sent(g.neighbours_size());
  std::vector<SendSpan> spans(g.neighbours_size());
  for (int i = 0; i < g.neighbours_size(); ++i) {
    senders.emplace_back([&, i] {
      const auto& n = g.neighbours(i);
      // A connection that fails is tried twice more (0.25 s, then 0.5 s later: a loaded
      // machine refuses one now and then). Still unreachable, the neighbour is taken for
      // crashed (a slow one admits the call and is waited for): the edge's other
      // direction will not come either.
      for (int attempt = 0;; ++attempt) {
        sent[i] = SendModel(n.address(), n.name(), task.run_id(), task.round(), self, n.token(),
                            bytes, opts.tls_ca, opts.tls_cert, opts.tls_key, timeout_s, &emulator,
                            &spans[i]);
        if (sent[i].code() != absl::StatusCode::kUnavailable || attempt == 2 || stop) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(250 << attempt));
      }
      if (sent[i].code() == absl::StatusCode::kUnavailable) {
        peer->GiveUp(task.round(), n.name());
        return;
      }
      // Reachable once, it may still crash before sending its own: while its model is
      // awaited, its port is tried each second, and three failures give it up too.
      peer->Watch(task.round(), n.name(), [&] {
        return PeerReachable(n.address(), n.name(), opts.tls_ca, opts.tls_cert, opts.tls_key, 2.0);
      }, std::chrono::seconds(1));
    });
  }
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::map<std::string, ParameterSet> theirs = peer->Collect(task.round(), deadline);
  const int64_t received = peer->bytes_received();
  for (auto& t : senders) t.join();
  report->set_neighbours(g.neighbours_size());
  std::vector<SendSpan> went;
  for (int i = 0; i < g.neighbours_size(); ++i) {
    if (sent[i].ok()) {
      report->set_bytes_sent(report->bytes_sent() + static_cast<int64_t>(bytes.size()));
      went.push_back(spans[i]);
    } else {
      spdlog::warn("round {}: model not sent to {}: {}", task.round(), g.neighbours(i).name(),
                   sent[i].ToString());
    }
  }
  report->set_uplink_mbps(UplinkMbps(report->bytes_sent(), went));
  report->set_heard(static_cast<int32_t>(theirs.size()));
  report->set_bytes_received(received);
  return theirs;
}

Status Client::Impl::HandleGossipTask(const TaskCall& c) {
  v1::Coordinator::Stub* stub = c.stub;
  const v1::Welcome& w = c.w;
  const v1::Task& task = c.task;
  if (!peer) {
    return c.Reject(absl::FailedPreconditionError(
        "a gossip task, but this client serves no Peer address (--peer-listen)"));
  }
  auto spec = Spec(stub, w, task.model());
  if (!spec.ok()) return c.Reject(spec.status());
  const std::string loss = task.train().loss().empty() ? "cross_entropy" : task.train().loss();
  if (Status s = CheckDataFitsModel(opts.train, *spec, loss, "local data"); !s.ok()) return c.Reject(s);
  if (Status s = BuildModel(task, *spec); !s.ok()) return c.Reject(s);
  // The model this client holds; the run's initial model until it holds one (the only
  // model it ever fetches from the server).
  ParameterSet held;
  {
    std::lock_guard<std::mutex> l(gossip_mu);
    if (gossip_run == task.run_id()) held = gossip_model;
  }
  if (held.size() == 0) {
    auto initial = FetchModel(stub, w, task);
    if (!initial.ok()) return c.Reject(initial.status());
    held = *std::move(initial);
  }
  if (Status s = model->SetParameters(held); !s.ok()) return c.Reject(s);
  const v1::GossipTask& g = task.gossip();
  if (!g.rule().empty()) {
    if (Status s = GossipRuleNames().Check(g.rule()); !s.ok()) return c.Reject(s);
  }
  if (!(g.byzantine() >= 0 && g.byzantine() < 1)) {
    return c.Reject(absl::InvalidArgumentError("scheduler.gossip_byzantine must be in [0, 1)"));
  }
  if (Status s = CheckMemory(task, *spec, FitFromProto(task.train())); !s.ok()) return c.Reject(s);
  std::map<std::string, std::string> tokens;
  for (const auto& n : g.neighbours()) tokens[n.name()] = n.token();
  peer->Expect(task.run_id(), task.round(), tokens, held);
  c.Accept();
  // Federated evaluation: the model this client holds, on its held-out data.
  std::optional<v1::ClientEvaluation> evaluation;
  if (opts.holdout.size > 0) {
    ASSIGN_OR_RETURN(evaluation, EvaluateHoldout(loss));
  }
  LocalTrainOptions o = TrainOptions(task.train());
  o.cancel = &stop;
  o.seed = BatchSeed(task, w, opts.name);
  auto trained_stats = model->Train(opts.train, o);
  if (!trained_stats.ok()) {
    // The neighbours expect a model: they get the one this client holds rather than wait
    // for the round's deadline; the task fails with the reason.
    if (trained_stats.status().code() != absl::StatusCode::kCancelled) {
      v1::GossipStats unused;
      ExchangeModels(c, held, &unused);
    }
    return trained_stats.status();
  }
  TrainStats stats = *trained_stats;
  emulator.Compute(stats.seconds);
  stats.seconds *= emulator.slowdown;
  RecordTraining(stats);
  const ParameterSet trained = model->Parameters();
  // A simulated attacker sends its neighbours the held model moved by its attack's update
  // (a finite poisoned model every round) and keeps mixing honestly itself.
  ParameterSet sent;
  if (!opts.attack.empty() && opts.attack != "label-flip") {
    ParameterSet delta = Delta(trained, held);
    RETURN_IF_ERROR(Attack(held, o, &delta));
    sent = held;
    for (size_t i = 0; i < sent.size(); ++i) {
      auto& x = sent.mutable_tensors()[i].values;
      const auto& d = delta.tensors()[i].values;
      for (size_t j = 0; j < x.size(); ++j) x[j] += d[j];
    }
  }

  v1::GossipStats report;
  const std::map<std::string, ParameterSet> theirs =
      ExchangeModels(c, sent.size() > 0 ? sent : trained, &report);
  UpdateState([&](ClientState& st) { st.gossip_uplink_mbps = report.uplink_mbps(); });
  std::vector<HeardModel> heard;
  for (const auto& n : g.neighbours()) {
    if (auto it = theirs.find(n.name()); it != theirs.end()) heard.push_back({n.weight(), &it->second});
  }
  GossipRule rule;
  rule.name = g.rule().empty() ? "mean" : g.rule();
  rule.byzantine = g.byzantine();
  GossipMixStats mix;
  ParameterSet mixed = MixGossip(rule, trained, heard, &mix);
  report.set_disagreement(theirs.empty() ? 0 : mix.disagreement / theirs.size());
  report.set_clipped(mix.clipped);
  {
    std::lock_guard<std::mutex> l(gossip_mu);
    gossip_model = std::move(mixed);
    gossip_run = task.run_id();
  }
  ASSIGN_OR_RETURN(v1::UploadReply reply,
                   UploadUpdate(stub, w, task, ParameterSet(), stats.examples, stats.loss,
                                stats.seconds, nullptr, evaluation ? &*evaluation : nullptr,
                                &report));
  ++tasks_done;
  spdlog::info("round {}: trained {} examples (loss {:.4f}), averaged with {} of {} neighbours "
               "({}, disagreement {:.3g}{}){}",
               task.round(), stats.examples, stats.loss, theirs.size(), g.neighbours_size(), rule.name,
               report.disagreement(),
               rule.name == "clipped" ? absl::StrFormat(", %d clipped to %.3g", mix.clipped, mix.radius) : "",
               reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

const std::vector<Client::Impl::TaskHandler>& Client::Impl::TaskHandlers() {
  static const std::vector<TaskHandler> handlers = {
      {"edge", [](const ClientOptions& o, const v1::Task&) { return static_cast<bool>(o.aggregate); },
       &Impl::HandleEdgeTask},
      {"external split", [](const ClientOptions& o, const v1::Task& t) { return o.external.split && t.has_split(); },
       &Impl::HandleExternalSplitTask},
      {"external", [](const ClientOptions& o, const v1::Task&) { return static_cast<bool>(o.external.fit); },
       &Impl::HandleExternalTask},
      {"gossip", [](const ClientOptions&, const v1::Task& t) { return t.has_gossip(); },
       &Impl::HandleGossipTask},
      {"split", [](const ClientOptions&, const v1::Task& t) { return t.has_split(); },
       &Impl::HandleSplitTask},
      {"evaluation", [](const ClientOptions&, const v1::Task& t) { return t.evaluate_only(); },
       &Impl::HandleEvaluationTask},
      {"training", [](const ClientOptions&, const v1::Task&) { return true; },
       &Impl::HandleTrainingTask},
  };
  return handlers;
}

Status Client::Impl::HandleTask(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                const v1::Task& task,
                                const std::function<void(const v1::TaskAck&)>& ack,
                                const NextMessage& next, bool* crashed) {
  const TaskCall call{stub, w, task, ack, next, crashed};
  // What the server asks this device to train with, checked before anything uses it (a
  // batch of 0 divided by zero).
  if (task.has_train()) {
    if (Status s = CheckFit(FitFromProto(task.train()), "the task's train settings"); !s.ok()) return call.Reject(s);
  }
  for (const TaskHandler& h : TaskHandlers()) {
    if (h.matches(opts, task)) return (this->*h.run)(call);
  }
  return call.Reject(absl::InternalError("no handler for the task"));
}

bool Client::Impl::BaseFromFolder(const v1::Task& task, const ModelSpec& spec) const {
  return !opts.model_dir.empty() && spec.name == "hf" && task.has_split() && !task.base_digest().empty() &&
         task.split().tail_begin() >= task.split().num_stages();  // not U-shaped
}

StatusOr<Client::Impl::TaskModel> Client::Impl::FetchTaskModel(const TaskCall& c) {
  TaskModel m;
  ASSIGN_OR_RETURN(m.spec, Spec(c.stub, c.w, c.task.model()));
  m.loss = c.task.train().loss().empty() ? "cross_entropy" : c.task.train().loss();
  RETURN_IF_ERROR(CheckDataFitsModel(opts.train, m.spec, m.loss, "local data"));
  ASSIGN_OR_RETURN(m.global, FetchModel(c.stub, c.w, c.task));
  // A model with a frozen base (LoRA): the blob with it, fetched once (unless a split
  // task reads it from this device's copy of the model's folder).
  if (!c.task.base_digest().empty() && !BaseFromFolder(c.task, m.spec) && base_digest != c.task.base_digest()) {
    ASSIGN_OR_RETURN(std::string bytes, FetchBlob(c.stub, c.w.client_id(), c.w.session_token(),
                                                  c.task.base_digest(), 600, &emulator));
    base = ParameterSet();
    base_digest.clear();
    ASSIGN_OR_RETURN(base, ParameterSet::Decode(bytes));
    base_digest = c.task.base_digest();
  }
  if (m.spec.quantize.empty() != c.task.quantized_base_digest().empty()) {
    return absl::InvalidArgumentError("a quantized model needs its quantized base, and only it");
  }
  if (!c.task.quantized_base_digest().empty() && quantized_digest != c.task.quantized_base_digest()) {
    quantized_base = {};  // its bytes are freed before the next arrive
    quantized_digest.clear();
    ASSIGN_OR_RETURN(std::string bytes, FetchBlob(c.stub, c.w.client_id(), c.w.session_token(),
                                                  c.task.quantized_base_digest(), 600, &emulator));
    ASSIGN_OR_RETURN(quantized_base, QuantizedSet::Parse(std::make_shared<const std::string>(std::move(bytes)),
                                                         m.spec.quantize));
    quantized_digest = c.task.quantized_base_digest();
  }
  return m;
}

Status Client::Impl::HandleSplitTask(const TaskCall& c) {
  const v1::Task& task = c.task;
  if (!hijack_suspected.ok()) return c.Reject(hijack_suspected);
  auto m = FetchTaskModel(c);
  if (!m.ok()) return c.Reject(m.status());
  c.Accept();
  SplitTaskOptions so;
  so.model = m->spec;
  so.seed = BatchSeed(task, c.w, opts.name);
  so.emulator = &emulator;
  so.cancel = &stop;
  if (BaseFromFolder(task, m->spec)) {
    so.model_dir = opts.model_dir;
  } else if (!task.base_digest().empty()) {
    so.base = &base;
  }
  if (!task.quantized_base_digest().empty()) so.quantized = &quantized_base;
  if (opts.crash_after_split_step) {
    const int64_t round = task.round();
    so.crash_after_step = [this, round](int64_t step) {
      return opts.crash_after_split_step(round, step);
    };
  }
  so.peer = {opts.tls_ca, opts.tls_cert, opts.tls_key, opts.name};
  if (opts.keep_sent > 0) {
    so.sent_path = SentPath(task, c.w);
    so.keep_sent = opts.keep_sent;
  }
  if (opts.split_guard.enabled && !split_guard) split_guard = std::make_unique<SplitGuard>(opts.split_guard);
  so.guard = split_guard.get();
  // Interoperable architectures: the device's base and fusion (its stages before the
  // cut) are its own, kept as personal layers: from its model's initialisation until it
  // has trained them.
  ParameterSet own;
  if (m->spec.name == "interop") {
    auto head = ModelPart::Create(m->spec, 0, task.split().cut());
    if (!head.ok()) return head.status();
    own = (*head)->Parameters();
    std::vector<std::string> names;
    for (const Tensor& t : own.tensors()) names.push_back(t.name);
    if (personal.size() == 0 && !PersonalFile().empty()) {
      personal = LoadPersonal(PersonalFile(), PersonalKey(task), names, own);
    }
    if (personal.size() > 0) RETURN_IF_ERROR(Overwrite(personal, &own));
    so.own = &own;
  }
  // A pipeline under secure aggregation: keys and shares before the chain runs.
  std::optional<SecAggClient> secagg;
  if (task.has_secagg()) {
    ASSIGN_OR_RETURN(secagg, SecAggClient::Prepare(c.stub, c.w, task, c.next));
  }
  // A pipeline's device past its data owner takes its micro-batches from upstream.
  auto r = task.split().has_upstream() ? RunPipelineRelay(c.stub, c.w, task, m->global, so, peer.get())
                                       : RunSplitTask(c.stub, c.w, task, m->global, opts.train, so);
  if (!r.ok() && r.status().code() == absl::StatusCode::kAborted && opts.crash_after_split_step) {
    *c.crashed = true;
    return r.status();
  }
  if (IsSplitGuardVerdict(r.status())) {
    hijack_suspected = r.status();
    spdlog::error("round {}: {}", task.round(), std::string(r.status().message()));
  }
  if (!r.ok()) return r.status();
  if (so.own != nullptr) {
    personal = std::move(r->own);
    if (!PersonalFile().empty()) {
      if (Status s = WriteFileAtomic(PersonalFile(), PersonalKey(task) + "\n" + personal.Encode()); !s.ok()) {
        spdlog::warn("personal layers not saved: {}", s.ToString());
      }
    }
  }
  const double seconds = r->stats.wall_s() * r->stats.steps();
  v1::UploadReply reply;
  if (secagg) {  // the part masked in the round's vector, weighted by the chain's owner
    ASSIGN_OR_RETURN(ParameterSet masked, MaskedPipelineVector(task.split(), Delta(r->trained, m->global)));
    ASSIGN_OR_RETURN(reply, secagg->Submit(c.stub, c.w, task, masked, r->examples, task.split().chain_weight(),
                                           r->loss, seconds, &emulator, c.next, &r->stats));
  } else {
    ASSIGN_OR_RETURN(reply, UploadUpdate(c.stub, c.w, task, Delta(r->trained, m->global), r->examples, r->loss,
                                         seconds, &r->stats));
  }
  ++tasks_done;
  if (split_guard && split_guard->fakes() > 0) {
    spdlog::info("round {}: SplitGuard: mean score {:.3f} of its last {} scores, {} fake micro-batches so far",
                 task.round(), split_guard->mean_score(), split_guard->scores(), split_guard->fakes());
  }
  spdlog::info("round {}: split task at [{}, {}) done: {} steps, {:.1f} ms/step (client {:.1f}, "
               "transfer {:.1f}, server {:.1f}), loss {:.4f}{}",
               task.round(), task.split().begin(), task.split().cut(), r->stats.steps(), 1e3 * r->stats.wall_s(),
               1e3 * r->stats.client_compute_s(), 1e3 * r->stats.transfer_s(),
               1e3 * r->stats.server_compute_s(), r->loss,
               secagg ? " (masked)" : reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

StatusOr<std::vector<std::string>> Client::Impl::SetTaskModel(const TaskCall& c, TaskModel& m) {
  const v1::Task& task = c.task;
  ParameterSet& global = m.global;
  RETURN_IF_ERROR(BuildModel(task, m.spec));
  // A model with a frozen base: its frozen tensors are the base's values (held once);
  // the blob, and `global`, hold the rest.
  if (!task.base_digest().empty()) {
    RETURN_IF_ERROR(model->LoadBase(base));
  } else if (!model->FrozenTensors().empty()) {
    return absl::InvalidArgumentError("a model with frozen tensors needs its base (Task.base_digest)");
  }
  if (m.loss == "torchscript" && loss_digest != task.train().loss_digest()) {
    ASSIGN_OR_RETURN(std::string archive,
                     FetchBlob(c.stub, c.w.client_id(), c.w.session_token(),
                               task.train().loss_digest(), 600, &emulator));
    RETURN_IF_ERROR(model->SetTorchScriptLoss(archive));
    loss_digest = task.train().loss_digest();
  }
  // Personal layers: this client's own values replace the global model's (the server's
  // initial values, until the client has trained them).
  std::vector<std::string> personal_names(task.model().personal().begin(),
                                          task.model().personal().end());
  for (const std::string& n : personal_names) {
    if (global.Find(n) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("personal tensor '", Printable(n), "' is not in the model"));
    }
  }
  if (m.spec.name == "interop") {
    // Interoperable architectures: the blob is the shared block; this device's base and
    // fusion are personal layers the blob does not hold, from its model's initialisation
    // until it has trained them.
    ParameterSet whole = model->Parameters();
    for (const Tensor& t : whole.tensors()) {
      if (InteropPrivate(t.name)) personal_names.push_back(t.name);
    }
    RETURN_IF_ERROR(Overwrite(global, &whole));
    global = std::move(whole);
  }
  if (personal.size() == 0 && !personal_names.empty() && !PersonalFile().empty()) {
    personal = LoadPersonal(PersonalFile(), PersonalKey(task), personal_names, global);
  }
  if (personal.size() > 0) RETURN_IF_ERROR(Overwrite(personal, &global));
  RETURN_IF_ERROR(model->SetTrainedParameters(global));
  if (!task.quantized_base_digest().empty()) RETURN_IF_ERROR(model->LoadQuantized(quantized_base));
  return personal_names;
}

Status Client::Impl::HandleEvaluationTask(const TaskCall& c) {
  auto m = FetchTaskModel(c);
  if (!m.ok()) return c.Reject(m.status());
  if (auto set = SetTaskModel(c, *m); !set.ok()) return c.Reject(set.status());
  if (opts.holdout.size == 0) {
    return c.Reject(absl::FailedPreconditionError("no held-out data to evaluate on (--holdout)"));
  }
  c.Accept();
  // No training: an empty update that carries the evaluation.
  ASSIGN_OR_RETURN(const v1::ClientEvaluation evaluation, EvaluateHoldout(m->loss));
  return UploadFinalEvaluation(c, evaluation, opts.train.size);
}

Status Client::Impl::CheckMemory(const v1::Task& task, const ModelSpec& spec, const FitSettings& fit) {
  if (opts.memory_limit_bytes <= 0) return absl::OkStatus();
  const std::string key = absl::StrCat(task.model().SerializeAsString(), "|", fit.batch_size, "|", fit.optimizer,
                                       "|", fit.momentum, "|", fit.recompute);
  if (key != memory_key) {
    std::vector<int64_t> sample = opts.train.shape;
    if (opts.train.type == ExampleType::kToken) sample = {opts.train.shape[0] - 1};
    ASSIGN_OR_RETURN(const TrainingCost cost, WholeModelCost(spec, sample, fit, 1));
    memory_need = cost.memory_bytes;
    memory_key = key;
  }
  const int64_t held = opts.count_resident ? ResidentBytes() : 0;
  if (held + memory_need > opts.memory_limit_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "training this model (batch %d, %s) needs about %d MiB beside the %d MiB this client holds, "
        "over its --memory-limit-mb %d",
        fit.batch_size, fit.optimizer, memory_need >> 20, held >> 20, opts.memory_limit_bytes >> 20));
  }
  return absl::OkStatus();
}

Status Client::Impl::HandleTrainingTask(const TaskCall& c) {
  const v1::Task& task = c.task;
  auto m = FetchTaskModel(c);
  if (!m.ok()) return c.Reject(m.status());
  auto personal_names = SetTaskModel(c, *m);
  if (!personal_names.ok()) return c.Reject(personal_names.status());
  if (Status s = CheckMemory(task, m->spec, FitFromProto(task.train())); !s.ok()) return c.Reject(s);
  const ParameterSet& global = m->global;
  c.Accept();
  // Federated evaluation: the global model on the held-out data, before training.
  std::optional<v1::ClientEvaluation> evaluation;
  if (opts.holdout.size > 0 && !task.has_secagg() && !task.skip_evaluation()) {
    ASSIGN_OR_RETURN(evaluation, EvaluateHoldout(m->loss));
  }
  std::optional<SecAggClient> secagg;
  if (task.has_secagg()) {
    ASSIGN_OR_RETURN(secagg, SecAggClient::Prepare(c.stub, c.w, task, c.next));
  }

  LocalTrainOptions o = TrainOptions(task.train());
  o.cancel = &stop;  // Stop() (e.g. SIGTERM) does not wait for the local epochs to end
  o.seed = BatchSeed(task, c.w, opts.name);
  if (opts.keep_sent > 0) KeepFirstBatch(task, c.w, o);
  ASSIGN_OR_RETURN(TrainStats stats, model->Train(opts.train, o));
  // An emulated slower device (--emulate-slowdown) takes that much longer to train; split
  // tasks idle after each step instead (split_client.cc).
  emulator.Compute(stats.seconds);
  stats.seconds *= emulator.slowdown;
  RecordTraining(stats);
  if (opts.crash_after_training && opts.crash_after_training(task.round())) {
    *c.crashed = true;
    return absl::AbortedError("simulated crash");
  }
  ParameterSet trained = model->TrainedParameters();
  if (!personal_names->empty()) {
    personal = Only(trained, *personal_names);
    if (!PersonalFile().empty()) {
      const std::string bytes = PersonalKey(task) + "\n" + personal.Encode();
      if (Status s = WriteFileAtomic(PersonalFile(), bytes); !s.ok()) {
        spdlog::warn("personal layers not saved: {}", s.ToString());
      }
    }
  }
  ParameterSet delta = Delta(std::move(trained), global);
  if (!opts.attack.empty() && opts.attack != "label-flip") {
    RETURN_IF_ERROR(Attack(global, o, &delta));
  }
  if (!personal_names->empty()) delta = Without(delta, *personal_names);  // stays here
  ASSIGN_OR_RETURN(v1::UploadReply reply,
                   UploadTrained(c, secagg, std::move(delta), stats, evaluation ? &*evaluation : nullptr));
  ++tasks_done;
  spdlog::info("round {}: {}trained {} examples in {:.1f}s (loss {:.4f}), update uploaded{}",
               task.round(),
               evaluation ? absl::StrFormat("global model %.4f accurate on %d held-out examples; ",
                                            evaluation->accuracy(), evaluation->examples())
                          : "",
               stats.examples, stats.seconds, stats.loss, reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

}  // namespace cleave
