// SplitDriver's pipelines (split.mode: pipeline): forming the round's chains, planning
// their segments, and what a round of them measured.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "server/modes/secagg_driver.h"
#include "server/modes/split_driver.h"
#include "server/observe/observe.h"
#include "server/server.h"
#include "split/pipeline_plan.h"

namespace cleave {
namespace {

double Total(const v1::Profile& p) {
  return std::accumulate(p.stage_seconds().begin(), p.stage_seconds().end(), 0.0);
}

}  // namespace

StatusOr<SplitChain> SplitDriver::PlanChainLocked(int64_t round, const std::string& owner,
                                                  std::vector<std::string>* pool, int chains) {
  const SplitConfig& sc = ctx_.config().split;
  SplitChain chain;
  // The planner, over the owner and every device left. Stage costs have the shape of the
  // server's own profile (taken alone, before any client ran: a device's profile, taken
  // while other clients profile beside it, is noisier stage by stage than in sum), and
  // each device its measured total relative to it, corrected by last round's
  // measurement. A fixed cut is the server's first stage, and the chain then has
  // exactly split.devices devices.
  const ClientState& o = clients_.at(owner);
  PipelineProblem p;
  p.model = ProblemFor(o.profile, chains);
  p.model.client_stage_s = p.model.server_stage_s;
  const double server_s = std::accumulate(p.model.server_stage_s.begin(), p.model.server_stage_s.end(), 0.0);
  p.max_devices = sc.devices;
  if (!sc.auto_cut()) {
    p.server_begin = sc.cut;
    p.min_devices = sc.devices;
  }
  p.micro_batches = {sc.micro_batches};
  p.schedule = sc.schedule == "gpipe" ? PipelineSchedule::kGpipe : PipelineSchedule::k1f1b;
  std::vector<std::string> ids = {owner};
  ids.insert(ids.end(), pool->begin(), pool->end());
  for (const std::string& id : ids) {
    const ClientState& c = clients_.at(id);
    ChainDevice d;
    d.name = id;
    const double s = Total(c.profile) * c.pipeline_slowdown;
    d.speed = s > 0 && server_s > 0 ? server_s / s : 1;
    d.up_bps = c.profile.uplink_bytes_per_s();
    d.down_bps = c.profile.downlink_bytes_per_s();
    d.rtt_s = c.profile.rtt_s();
    d.memory_limit_bytes = c.profile.memory_limit_bytes();
    p.devices.push_back(d);
  }
  // split.plan: even: the devices in order, [0, cut) shared out evenly (a baseline).
  ASSIGN_OR_RETURN(PipelinePlan plan, sc.plan == "even" ? EqualSplitPlan(p, sc.micro_batches) : PlanPipeline(p));
  for (int i : plan.chain) chain.devices.push_back(ids[i]);
  chain.bounds = plan.bounds;
  for (size_t i = 1; i < plan.chain.size(); ++i) {
    pool->erase(std::find(pool->begin(), pool->end(), ids[plan.chain[i]]));
  }
  // What each device's segment should cost per micro-batch by its profile alone (the
  // plan's compute without last round's correction), to measure it against.
  for (size_t i = 0; i < plan.chain.size(); ++i) {
    ClientState& c = clients_.at(ids[plan.chain[i]]);
    c.pipeline_predicted_s = plan.resource_s[2 * i] / c.pipeline_slowdown;
  }
  std::vector<std::string> memory;
  for (size_t i = 0; i < plan.chain.size(); ++i) {
    const int64_t limit = p.devices[plan.chain[i]].memory_limit_bytes;
    memory.push_back(absl::StrCat(plan.memory_bytes[i] >> 20, limit > 0 ? absl::StrCat("/", limit >> 20) : "", " MiB"));
  }
  spdlog::info("round {}: chain of {} planned{}: predicted step {:.1f} ms, bottleneck {:.1f} ms per micro-batch, "
               "training memory {}",
               round, plan.chain.size(), sc.plan == "even" ? " (even)" : "", 1e3 * plan.step_s, 1e3 * plan.bottleneck_s,
               absl::StrJoin(memory, ", "));
  return chain;
}

void SplitDriver::WireChainLocked(int64_t round, int index, const SplitChain& chain,
                                  std::vector<std::string>* chosen) {
  const SplitConfig& sc = ctx_.config().split;
  std::vector<std::string> names;
  const size_t n = chain.devices.size();
  std::vector<std::string> tokens(n);
  for (auto& t : tokens) t = RandomHex(16);
  for (size_t i = 0; i < n; ++i) {
    const std::string& id = chain.devices[i];
    const Session& s = *ctx_.FindSessionLocked(id);
    names.push_back(absl::StrCat(s.name, " [", chain.bounds[i], ", ", chain.bounds[i + 1], ")"));
    v1::SplitTask& h = hops_[id];
    h.set_begin(chain.bounds[i]);
    h.set_micro_batches(sc.micro_batches);
    h.set_micro_batch_tokens(sc.micro_batch_tokens);
    h.set_chain(index);
    if (i > 0) {
      const Session& up = *ctx_.FindSessionLocked(chain.devices[i - 1]);
      h.mutable_upstream()->set_name(up.name);
      h.mutable_upstream()->set_address(up.peer_address);  // "" when it serves no Peer
      h.mutable_upstream()->set_token(tokens[i]);
    }
    if (i + 1 < n) {
      const Session& down = *ctx_.FindSessionLocked(chain.devices[i + 1]);
      h.mutable_downstream()->set_name(down.name);
      h.mutable_downstream()->set_address(down.peer_address);
      h.mutable_downstream()->set_token(tokens[i + 1]);
    }
    chosen->push_back(id);
  }
  spdlog::info("round {}: chain {}: {} -> server [{}, {}){}, {} ({})", round, index,
               absl::StrJoin(names, " -> "), chain.bounds.back(), tail_begin_,
               tail_begin_ < num_stages_ ? absl::StrCat(" -> ", names[0].substr(0, names[0].find(' ')), " [",
                                                        tail_begin_, ", ", num_stages_, ")")
                                         : "",
               sc.micro_batch_tokens > 0 ? absl::StrCat("micro-batches of ", sc.micro_batch_tokens, " tokens")
                                         : absl::StrCat(sc.micro_batches, " micro-batches"),
               sc.schedule);
}

Status SplitDriver::BeginPipelineLocked(int64_t round, const FitSettings& fit, std::vector<std::string>* clients) {
  const FederationConfig& cfg = ctx_.config();
  const SplitConfig& sc = cfg.split;
  // Data owners first: a client that serves no Peer can only send; then the most examples
  // (then by name: the same federation forms the same chains).
  std::vector<std::string> order = *clients;
  auto serves = [&](const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    return !ctx_.FindSessionLocked(id)->peer_address.empty();
  };
  auto before = [&](const std::string& a, const std::string& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ctx_.mu()) {
    const Session& x = *ctx_.FindSessionLocked(a);
    const Session& y = *ctx_.FindSessionLocked(b);
    if (x.peer_address.empty() != y.peer_address.empty()) return x.peer_address.empty();
    if (x.num_examples != y.num_examples) return x.num_examples > y.num_examples;
    return x.name < y.name;
  };
  std::stable_sort(order.begin(), order.end(), before);
  // As many chains as there are devices for: each needs split.devices - 1 that serve Peer
  // (with an auto cut the planner may use fewer, and the rest sit the round out).
  const int k = sc.devices;
  int chains = static_cast<int>(order.size()) / k;
  while (chains > 0) {
    int peers = 0;
    for (size_t i = chains; i < order.size(); ++i) peers += serves(order[i]);
    if (peers >= chains * (k - 1)) break;
    --chains;
  }
  if (chains == 0) {
    return absl::AbortedError(absl::StrCat("round ", round, ": no chain of split.devices ", k, " (", k - 1,
                                           " serving Peer, cleave-client --peer-listen) among ", order.size(),
                                           " clients"));
  }
  std::vector<std::string> pool;
  for (size_t i = chains; i < order.size(); ++i) {
    if (serves(order[i])) pool.push_back(order[i]);
  }
  chains_.clear();
  hops_.clear();
  chain_weights_.clear();
  std::vector<std::string> chosen;
  for (int c = 0; c < chains; ++c) {
    auto chain = PlanChainLocked(round, order[c], &pool, chains);
    if (!chain.ok()) {
      spdlog::warn("round {}: no chain for {}: {}", round, ctx_.FindSessionLocked(order[c])->name,
                   std::string(chain.status().message()));
      continue;
    }
    WireChainLocked(round, static_cast<int>(chains_.size()), *chain, &chosen);
    chains_.push_back(*std::move(chain));
  }
  if (chains_.empty()) return absl::AbortedError(absl::StrCat("round ", round, ": no chain could be planned"));
  for (const std::string& id : order) {
    if (!hops_.count(id)) {
      spdlog::info("round {}: client {} is in no chain", round, ctx_.FindSessionLocked(id)->name);
    }
  }
  ASSIGN_OR_RETURN(round_, SplitRound::CreatePipeline(RoundOptionsLocked(fit), ctx_.GlobalLocked(), chains_));
  *clients = std::move(chosen);
  return absl::OkStatus();
}

void SplitDriver::TaskFailedLocked(const TaskRecord& t) {
  if (!tasks_.count(t.id) || !round_) return;
  round_->Fail(t.client_id);
  if (secagg_) {
    secagg_->mu().AssertHeld();  // ctx_.mu()
    secagg_->TaskFailedLocked(t);
  }
  if (mode_ != SplitMode::kPipeline) return;
  for (const SplitChain& chain : chains_) {
    if (std::find(chain.devices.begin(), chain.devices.end(), t.client_id) == chain.devices.end()) continue;
    const Session* s = ctx_.FindSessionLocked(t.client_id);
    for (auto& [id, other] : ctx_.TasksLocked()) {
      if (other.state != TaskState::kAssigned || !tasks_.count(id) ||
          std::find(chain.devices.begin(), chain.devices.end(), other.client_id) == chain.devices.end()) {
        continue;
      }
      ctx_.FailTaskLocked(id, other, absl::StrCat("its pipeline chain broke: the task of ", s ? s->name : t.client_id,
                                                  " failed (", t.failure, ")"));
    }
  }
}

void SplitDriver::ClosePipelineLocked(int64_t round, SplitMetrics* sm) {
  std::map<std::string, const TaskRecord*> by_client;
  for (const auto& [id, t] : ctx_.TasksLocked()) {
    if (tasks_.count(id)) by_client[t.client_id] = &t;
  }
  for (const SplitChain& chain : chains_) {
    SplitMetrics::Chain mc;
    mc.bounds = chain.bounds;
    mc.done = true;
    double first = 0;
    for (size_t i = 0; i < chain.devices.size(); ++i) {
      const std::string& id = chain.devices[i];
      const Session* s = ctx_.FindSessionLocked(id);
      mc.devices.push_back(s ? s->name : id);
      auto t = by_client.find(id);
      const bool done = t != by_client.end() && t->second->state == TaskState::kDone;
      mc.done = mc.done && done;
      const v1::SplitStats* st = done ? &tasks_.at(t->second->id).stats : nullptr;
      mc.busy.push_back(st && st->wall_s() > 0 ? std::min(1.0, st->client_compute_s() / st->wall_s()) : 0);
      if (!st) continue;
      for (const v1::PipelineSpan& x : st->spans()) {
        if (first == 0 || x.start_s() < first) first = x.start_s();
        mc.spans.push_back({static_cast<int>(i), x.micro_batch(), x.forward(), x.start_s(), x.end_s()});
      }
      // Re-planning: how this device's compute per micro-batch compared with its plan.
      auto c = clients_.find(id);
      if (c != clients_.end() && c->second.pipeline_predicted_s > 0 && st->client_compute_s() > 0) {
        const double ratio = st->client_compute_s() / c->second.pipeline_predicted_s;
        c->second.pipeline_slowdown = std::clamp((c->second.pipeline_slowdown + ratio) / 2, 0.01, 100.0);
      }
    }
    for (auto& x : mc.spans) {
      x.start_s -= first;
      x.end_s -= first;
    }
    mc.bubble = mc.busy.empty() ? 0
                                : 1 - std::accumulate(mc.busy.begin(), mc.busy.end(), 0.0) / mc.busy.size();
    spdlog::info("round {}: chain {} {}: devices busy {}, bubble {:.2f}", round, &chain - chains_.data(),
                 mc.done ? "done" : "failed", absl::StrJoin(mc.busy, ", ", [](std::string* out, double b) {
                   absl::StrAppend(out, absl::StrFormat("%.2f", b));
                 }),
                 mc.bubble);
    sm->chains.push_back(std::move(mc));
  }
}

}  // namespace cleave
