// Client: a gossip task (decentralised rounds): train the model held, exchange it with
// the neighbours over the Peer port (client/gossip.h), mix what was heard.
#include "client/client_impl.h"

#include "aggregation/gossip_mix.h"
#include "proto/train_config.h"

namespace cleave {

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

StatusOr<ParameterSet> Client::Impl::GossipHeldModel(const TaskCall& c, const std::string& loss) {
  const v1::Task& task = c.task;
  if (!peer) {
    return absl::FailedPreconditionError("a gossip task, but this client serves no Peer address (--peer-listen)");
  }
  ASSIGN_OR_RETURN(const ModelSpec spec, models.Spec(c.stub, c.w, task.model()));
  RETURN_IF_ERROR(CheckDataFitsModel(opts.train, spec, loss, "local data"));
  RETURN_IF_ERROR(models.Build(task, spec));
  // The model this client holds; the run's initial model until it holds one (the only
  // model it ever fetches from the server).
  ParameterSet held;
  {
    MutexLock l(&gossip_mu);
    if (gossip_run == task.run_id()) held = gossip_model;
  }
  if (held.size() == 0) {
    ASSIGN_OR_RETURN(held, models.FetchGlobal(c.stub, c.w, task));
  }
  RETURN_IF_ERROR(models.model()->SetParameters(held));
  const v1::GossipTask& g = task.gossip();
  if (!g.rule().empty()) RETURN_IF_ERROR(GossipRuleNames().Check(g.rule()));
  if (!(g.byzantine() >= 0 && g.byzantine() < 1)) {
    return absl::InvalidArgumentError("scheduler.gossip_byzantine must be in [0, 1)");
  }
  RETURN_IF_ERROR(models.CheckMemory(task, spec, FitFromProto(task.train())));
  return held;
}

StatusOr<ParameterSet> Client::Impl::GossipSent(const ParameterSet& held, const ParameterSet& trained,
                                                const LocalTrainOptions& o) {
  if (opts.attack.empty() || opts.attack == "label-flip") return trained;
  // A simulated attacker sends its neighbours the held model moved by its attack's update
  // (a finite poisoned model every round) and keeps mixing honestly itself.
  ParameterSet delta = Delta(trained, held);
  RETURN_IF_ERROR(Attack(held, o, &delta));
  ParameterSet sent = held;
  for (size_t i = 0; i < sent.size(); ++i) {
    auto& x = sent.mutable_tensors()[i].values;
    const auto& d = delta.tensors()[i].values;
    for (size_t j = 0; j < x.size(); ++j) x[j] += d[j];
  }
  return sent;
}

Status Client::Impl::HandleGossipTask(const TaskCall& c) {
  v1::Coordinator::Stub* stub = c.stub;
  const v1::Welcome& w = c.w;
  const v1::Task& task = c.task;
  const std::string loss = task.train().loss().empty() ? "cross_entropy" : task.train().loss();
  StatusOr<ParameterSet> start = GossipHeldModel(c, loss);
  if (!start.ok()) return c.Reject(start.status());
  const ParameterSet held = *std::move(start);
  const v1::GossipTask& g = task.gossip();
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
  auto trained_stats = models.model()->Train(opts.train, o);
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
  const ParameterSet trained = models.model()->Parameters();
  ASSIGN_OR_RETURN(const ParameterSet sent, GossipSent(held, trained, o));
  v1::GossipStats report;
  const std::map<std::string, ParameterSet> theirs = ExchangeModels(c, sent, &report);
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
    MutexLock l(&gossip_mu);
    gossip_model = std::move(mixed);
    gossip_run = task.run_id();
  }
  ASSIGN_OR_RETURN(v1::UploadReply reply,
                   uploader.Upload(stub, w, task, ParameterSet(), stats.examples, stats.loss,
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

}  // namespace cleave
