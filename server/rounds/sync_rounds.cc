// Synchronous rounds (SyncRounds) and split learning's turns (TurnRounds).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "aggregation/strategy.h"
#include "server/options.h"
#include "server/rounds/scheduler.h"
#include "server/server.h"

namespace cleave {

SyncRounds::SyncRounds(RoundContext& ctx, RoundHooks& driver) : ctx_(ctx), driver_(driver) {
  // The job layer checked the name (and refuses oort with split.mode and DP).
  const SelectionKind* kind = Selections().Find(ctx.config().clients.selection);
  if (kind != nullptr && kind->make) selector_ = kind->make(ctx.config().clients);
}

Status SyncRounds::CheckRoundLocked(const std::string& what, int64_t round) const {
  const int64_t current = ctx_.CurrentRoundLocked();
  if (current == 0 || round != current) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " for round ", round, ", the current round is ", current));
  }
  return absl::OkStatus();
}

ClientSampler SyncRounds::SelectorSampler(int64_t round, const std::vector<std::string>& available) {
  // The sampler runs within PlanLocked, with the lock held.
  return [this, round, &available](int k) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::multimap<std::string, std::string> ids;  // name -> session id
    std::vector<std::string> names;
    for (const auto& cid : available) {
      const std::string& name = ctx_.FindSessionLocked(cid)->name;
      ids.emplace(name, cid);
      names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    std::vector<std::string> chosen;
    for (const auto& name : selector_->Select(names, k, round, ctx_.RngLocked())) {
      chosen.push_back(ids.find(name)->second);
    }
    std::sort(chosen.begin(), chosen.end());
    return chosen;
  };
}

RoundPlan SyncRounds::PlanLocked(int64_t round, bool evaluate_only) {
  RoundPlan plan;
  const std::vector<std::string> available = ctx_.AvailableLocked();
  if (evaluate_only) {  // every connected client; the strategy's state is left alone
    plan.clients = available;
    plan.fit.loss = ctx_.config().train.loss;
    return plan;
  }
  // One sampling step: the strategy asks for its clients, and the selector (when
  // clients.selection names one) or the uniform draw picks them.
  plan = ctx_.strategy().ConfigureRound(round, available,
                                        selector_ ? SelectorSampler(round, available)
                                                  : UniformSampler(available, ctx_.RngLocked()));
  if (const FitSettings* edge = ctx_.EdgeFitLocked()) {  // an edge trains as its upstream says
    plan.fit = *edge;
    plan.client_fit.clear();
  }
  return plan;
}

StatusOr<RoundMetrics> SyncRounds::RunLocked(bool evaluate_only) {
  const FederationConfig& cfg = ctx_.config();
  const Clock& clock = ctx_.clock();
  const int64_t round = ctx_.CommittedRoundLocked() + (evaluate_only ? 0 : 1);
  RETURN_IF_ERROR(ctx_.AwaitClientsLocked());

  const auto start = clock.Now();  // wall_s: from sampling to commit
  RoundPlan plan = PlanLocked(round, evaluate_only);
  if (!plan.stop_reason.empty()) return absl::OutOfRangeError(plan.stop_reason);
  // The driver's own kind of round (cuts, secure aggregation); not for an evaluation.
  RoundHooks& driver = evaluate_only ? static_cast<RoundHooks&>(plain_) : driver_;
  // Who the driver cannot serve is left out before the round is sized from its clients.
  RETURN_IF_ERROR(driver.ChooseLocked(round, plan.fit, &plan.clients));
  ctx_.BeginRoundLocked(round, plan.clients, driver, evaluate_only);
  if (Status s = driver.BeginLocked(round, plan.fit, plan.clients); !s.ok()) {
    ctx_.EndRoundLocked();
    return s;
  }
  const auto deadline = clock.Now() + Seconds(cfg.clients.round_deadline_s);
  const int64_t deadline_ms = UnixMsIn(cfg.clients.round_deadline_s);
  ctx_.SendTasksLocked(round, FirstWaveLocked(plan.clients), plan, deadline_ms);
  spdlog::info("round {}: {} clients selected", round, plan.clients.size());
  ctx_.SetPhaseLocked(evaluate_only ? "evaluating" : "training");
  std::optional<Status> driven = driver.AwaitLocked(deadline);
  while (!driven && !ctx_.StoppingLocked() && clock.Now() < deadline) {
    if (ctx_.RoundResolvedLocked()) {
      if (!NextWaveLocked(round, plan, deadline_ms)) break;
      continue;
    }
    ctx_.WaitLocked(deadline);
  }
  // Uploads past their checks are being validated and added outside the lock: they end
  // (accepted or refused) before the round closes. CPU work, not a wait on a client.
  ctx_.AwaitAccumulatingLocked();
  if (ctx_.StoppingLocked()) {
    ctx_.EndRoundLocked();
    return absl::CancelledError("stopped");
  }
  double loss_sum = 0;
  int64_t weight = 0;
  RoundMetrics m = CloseLocked(round, start, evaluate_only, &loss_sum, &weight);
  driver.CloseLocked(round, &m);
  ctx_.EndRoundLocked();
  ctx_.ReleaseUploadsLocked();  // late or stalled uploads of the round just closed
  if (driven) RETURN_IF_ERROR(*driven);  // nothing of an aborted secure aggregation is used
  const int selected = std::max<int>(1, plan.clients.size());
  const int quorum = std::max(1, static_cast<int>(std::ceil(cfg.clients.quorum * selected)));
  ctx_.CountRoundBytesLocked(&m);
  if (m.participants < quorum && !evaluate_only) {
    return absl::AbortedError(absl::StrCat("round ", round, ": ", m.participants, " of ",
                                           selected, " results, quorum is ", quorum));
  }
  if (evaluate_only) {  // clients without held-out data decline; any result counts
    if (m.participants == 0) return absl::AbortedError("no client evaluated the model");
    m.evaluation_only = true;
    m.wall_s = std::chrono::duration<double>(clock.Now() - start).count();
    return m;
  }
  m.train_loss = weight ? loss_sum / weight : 0;
  m.examples = weight;
  if (!driver.Aggregates()) {  // the clients keep the models: nothing to apply here
    ctx_.CommitWithoutModelLocked(round);
    m.wall_s = std::chrono::duration<double>(clock.Now() - start).count();
    return m;
  }
  RETURN_IF_ERROR(ctx_.ApplyLocked(round, [&](const ParameterSet& layout) -> Status {
    RETURN_IF_ERROR(driver.Fold(layout, weight));
    return ctx_.FlTrustReference(plan.fit);
  }, &m));
  m.wall_s = std::chrono::duration<double>(clock.Now() - start).count();
  return m;
}

RoundMetrics SyncRounds::CloseLocked(int64_t round, Clock::time_point start, bool evaluate_only,
                                     double* loss_sum, int64_t* weight) {
  // Anything still assigned is a straggler and counts as failed.
  RoundMetrics m;
  m.round = round;
  m.failures = UnservedLocked(round);
  std::vector<ClientEvaluationResult> evaluated;
  for (auto& [id, t] : ctx_.TasksLocked()) {
    if (t.state == TaskState::kAssigned) ctx_.FailTaskLocked(id, t, "missed the round's deadline");
    const Session* s = ctx_.FindSessionLocked(t.client_id);
    const std::string& name = s ? s->name : t.client_id;
    if (selector_ && !t.evaluate_only && s) {
      if (t.state == TaskState::kDone) {
        selector_->Observe(name, round, static_cast<double>(t.num_examples) * t.train_loss,
                       std::chrono::duration<double>(t.done_at - start).count());
      } else {
        selector_->MissedDeadline(name, round, ctx_.config().clients.round_deadline_s);
      }
    }
    if (t.state != TaskState::kDone) {
      ++m.failures;
      continue;
    }
    ++m.participants;
    *loss_sum += t.train_loss * t.num_examples;
    *weight += t.num_examples;
    if (t.evaluation.examples() > 0) {
      ClientEvaluationResult r;
      r.client_id = t.client_id;
      r.client_name = name;
      r.examples = t.evaluation.examples();
      r.accuracy = t.evaluation.accuracy();
      r.loss = t.evaluation.loss();
      r.metrics.insert(t.evaluation.metrics().begin(), t.evaluation.metrics().end());
      r.seconds = t.evaluation.seconds();
      r.train_seconds = t.train_seconds;
      evaluated.push_back(std::move(r));
    }
  }
  if (selector_ && !evaluate_only) selector_->EndRound();
  m.client_eval = ctx_.strategy().AggregateEvaluation(round, evaluated);
  return m;
}

std::vector<std::string> TurnRounds::FirstWaveLocked(const std::vector<std::string>& clients) {
  // One client at a time, each continuing from the client part the previous one left.
  turns_.assign(clients.begin() + std::min<size_t>(1, clients.size()), clients.end());
  lost_ = 0;
  return std::vector<std::string>(clients.begin(),
                                  clients.begin() + std::min<size_t>(1, clients.size()));
}

bool TurnRounds::NextWaveLocked(int64_t round, const RoundPlan& plan, int64_t deadline_ms) {
  while (!turns_.empty()) {
    std::string next = turns_.front();
    turns_.pop_front();
    if (ctx_.FindSessionLocked(next)) {
      ctx_.SendTasksLocked(round, {next}, plan, deadline_ms);
      return true;
    }
    spdlog::warn("round {}: client {} left before its turn", round, next);
    ++lost_;
  }
  return false;
}

int TurnRounds::UnservedLocked(int64_t round) {
  for (const auto& cid : turns_) spdlog::warn("round {}: client {} never got its turn", round, cid);
  const int n = lost_ + static_cast<int>(turns_.size());
  turns_.clear();
  lost_ = 0;
  return n;
}

}  // namespace cleave
