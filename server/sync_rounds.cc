// Synchronous rounds (SyncRounds) and split learning's turns (TurnRounds).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "server/scheduler.h"

namespace cleave {

Status SyncRounds::CheckRoundLocked(const std::string& what, int64_t round) const {
  if (c_.current_round_ == 0 || round != c_.current_round_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " for round ", round, ", the current round is ", c_.current_round_));
  }
  return absl::OkStatus();
}

RoundPlan SyncRounds::PlanLocked(int64_t round, bool evaluate_only) {
  RoundPlan plan;
  if (evaluate_only) {  // every connected client; the strategy's state is left alone
    plan.clients = c_.AvailableLocked();
    plan.fit.loss = c_.cfg_.train.loss;
    return plan;
  }
  plan = c_.strategy_->ConfigureRound(round, c_.AvailableLocked(), c_.rng_);
  if (c_.oort_) {  // the same number of clients, picked by utility and speed
    std::multimap<std::string, std::string> ids;  // name -> session id
    std::vector<std::string> names;
    for (const auto& cid : c_.AvailableLocked()) {
      ids.emplace(c_.sessions_[cid].name, cid);
      names.push_back(c_.sessions_[cid].name);
    }
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    const int k = static_cast<int>(plan.clients.size());
    plan.clients.clear();
    for (const auto& name : c_.oort_->Select(names, k, round, c_.rng_)) {
      plan.clients.push_back(ids.find(name)->second);
    }
    std::sort(plan.clients.begin(), plan.clients.end());
  }
  if (c_.edge_fit_) {  // an edge trains as its upstream says
    plan.fit = *c_.edge_fit_;
    plan.client_fit.clear();
  }
  return plan;
}

StatusOr<RoundMetrics> SyncRounds::RunLocked(bool evaluate_only) {
  const int64_t round = evaluate_only ? c_.committed_round_ : c_.committed_round_ + 1;
  RETURN_IF_ERROR(c_.AwaitClientsLocked());

  const auto start = c_.clock_->Now();  // wall_s: from sampling to commit
  RoundPlan plan = PlanLocked(round, evaluate_only);
  if (!plan.stop_reason.empty()) return absl::OutOfRangeError(plan.stop_reason);
  c_.round_clients_ = std::max<int>(1, plan.clients.size());
  {
    std::vector<int64_t> declared;
    for (const auto& cid : plan.clients) declared.push_back(c_.sessions_[cid].num_examples);
    c_.round_weights_ = RoundWeights(c_.cfg_.aggregation, declared);
  }
  if (!evaluate_only) c_.strategy_->BeginRound(c_.UpdateLayout(), c_.shards_);
  c_.evaluating_ = evaluate_only;
  c_.OpenRoundLocked(round);
  // The driver's own kind of round (cuts, secure aggregation); not for an evaluation.
  RoundDriver& driver = evaluate_only ? c_.plain_driver_ : driver_;
  c_.driver_ = &driver;
  if (Status s = driver.BeginLocked(round, plan.fit, &plan.clients); !s.ok()) {
    c_.current_round_ = 0;
    c_.driver_ = &c_.plain_driver_;
    return s;
  }
  const auto deadline = c_.clock_->Now() + Seconds(c_.cfg_.clients.round_deadline_s);
  const int64_t deadline_ms = Coordinator::UnixMsIn(c_.cfg_.clients.round_deadline_s);
  c_.SendTasksLocked(round, FirstWaveLocked(plan.clients), plan, deadline_ms);
  spdlog::info("round {}: {} clients selected", round, plan.clients.size());
  c_.phase_ = evaluate_only ? "evaluating" : "training";
  std::optional<Status> driven = driver.AwaitLocked(deadline);
  while (!driven && !c_.stopping_ && c_.clock_->Now() < deadline) {
    if (c_.RoundResolvedLocked()) {
      if (!NextWaveLocked(round, plan, deadline_ms)) break;
      continue;
    }
    c_.WaitLocked(deadline);
    c_.ExpireSilentLocked();
  }
  // Uploads past their checks are being validated and added outside the lock: they end
  // (accepted or refused) before the round closes. CPU work, not a wait on a client.
  c_.AwaitAccumulatingLocked();
  c_.evaluating_ = false;
  if (c_.stopping_) {
    c_.current_round_ = 0;
    c_.driver_ = &c_.plain_driver_;
    return absl::CancelledError("stopped");
  }
  double loss_sum = 0;
  int64_t weight = 0;
  RoundMetrics m = CloseLocked(round, start, evaluate_only, &loss_sum, &weight);
  driver.CloseLocked(round, &m);
  c_.current_round_ = 0;
  c_.driver_ = &c_.plain_driver_;
  c_.mu_.Unlock();
  c_.uploads_.CancelAll();  // late or stalled uploads of the round just closed
  c_.DropBuffers();        // not held while the next model is built beside the current one
  c_.mu_.Lock();
  if (driven) RETURN_IF_ERROR(*driven);  // nothing of an aborted secure aggregation is used
  const int selected = std::max<int>(1, plan.clients.size());
  const int quorum = std::max(1, static_cast<int>(std::ceil(c_.cfg_.clients.quorum * selected)));
  c_.CountRoundBytesLocked(&m);
  if (m.participants < quorum && !evaluate_only) {
    return absl::AbortedError(absl::StrCat("round ", round, ": ", m.participants, " of ",
                                           selected, " results, quorum is ", quorum));
  }
  if (evaluate_only) {  // clients without held-out data decline; any result counts
    if (m.participants == 0) return absl::AbortedError("no client evaluated the model");
    m.evaluation_only = true;
    m.wall_s = std::chrono::duration<double>(c_.clock_->Now() - start).count();
    return m;
  }
  m.train_loss = weight ? loss_sum / weight : 0;
  m.examples = weight;
  if (!driver.Aggregates()) {  // the clients keep the models: nothing to apply here
    c_.committed_round_ = round;
    m.wall_s = std::chrono::duration<double>(c_.clock_->Now() - start).count();
    return m;
  }
  RETURN_IF_ERROR(c_.ApplyLocked(round, [&](const ParameterSet& layout) -> Status {
    RETURN_IF_ERROR(driver.Fold(layout, weight));
    if (c_.root_.size > 0) {
      RETURN_IF_ERROR(c_.SetFlTrustReference(c_.RunThreadGlobal(), plan.fit));
    }
    return absl::OkStatus();
  }, &m));
  m.wall_s = std::chrono::duration<double>(c_.clock_->Now() - start).count();
  return m;
}

RoundMetrics SyncRounds::CloseLocked(int64_t round, Clock::time_point start, bool evaluate_only,
                                     double* loss_sum, int64_t* weight) {
  // Anything still assigned is a straggler and counts as failed.
  RoundMetrics m;
  m.round = round;
  m.failures = UnservedLocked(round);
  std::vector<ClientEvaluationResult> evaluated;
  for (auto& [id, t] : c_.tasks_) {
    if (t.state == TaskState::kAssigned) c_.FailTaskLocked(id, t, "missed the round's deadline");
    auto s = c_.sessions_.find(t.client_id);
    const std::string& name = s != c_.sessions_.end() ? s->second.name : t.client_id;
    if (c_.oort_ && !t.evaluate_only && s != c_.sessions_.end()) {
      if (t.state == TaskState::kDone) {
        c_.oort_->Observe(name, round, static_cast<double>(t.num_examples) * t.train_loss,
                          std::chrono::duration<double>(t.done_at - start).count());
      } else {
        c_.oort_->MissedDeadline(name, round, c_.cfg_.clients.round_deadline_s);
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
  if (c_.oort_ && !evaluate_only) c_.oort_->EndRound();
  m.client_eval = c_.strategy_->AggregateEvaluation(round, evaluated);
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
    if (c_.sessions_.count(next)) {
      c_.SendTasksLocked(round, {next}, plan, deadline_ms);
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
