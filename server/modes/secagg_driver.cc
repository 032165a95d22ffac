#include "server/modes/secagg_driver.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "aggregation/strategy.h"
#include "aggregation/weighting.h"
#include "core/printable.h"
#include "server/options.h"
#include "server/server.h"
#include "server/transport/transport.h"

namespace cleave {

bool SecAggDriver::UniformWeights() const {
  return (ctx_.config().dp.enabled && ctx_.config().dp.noise == "distributed") ||
         ctx_.config().aggregation.weighting == "equal";
}

Status SecAggDriver::BeginLocked(int64_t round, const FitSettings& /*fit*/,
                                 const std::vector<std::string>& clients) {
  // Updates are weighted by examples, except under DP, where every clipped update counts
  // the same (max_weight 1: every client's scale is 1).
  int64_t max_weight = 1;
  if (!UniformWeights()) {
    for (const auto& cid : clients) {
      max_weight = std::max(max_weight, ctx_.RoundWeightsLocked().Weight(ctx_.FindSessionLocked(cid)->num_examples));
    }
  }
  return StartLocked(round, clients, ctx_.UpdateLayoutLocked().total_elements(), max_weight);
}

Status SecAggDriver::StartLocked(int64_t round, const std::vector<std::string>& clients, int64_t length,
                                 int64_t max_weight) {
  closed_.reset();
  const auto& c = ctx_.config().secure_aggregation;
  const uint64_t levels = (uint64_t{1} << c.bits) - 1;
  if (levels * clients.size() >= c.modulus) {
    return absl::FailedPreconditionError(absl::StrCat(
        "secure_aggregation.modulus ", c.modulus, " is too small for ", clients.size(),
        " clients of 2^", c.bits, " levels each: sums would wrap"));
  }
  round_ = std::make_unique<SecAggRound>(c, absl::StrCat(ctx_.RunIdLocked(), "|round ", round), clients, length,
                                         max_weight, ctx_.RngLocked()());
  return absl::OkStatus();
}

Status SecAggDriver::SetSlicesLocked(const std::map<std::string, std::shared_ptr<const SecAggSlice>>& slices) {
  if (!round_) return absl::FailedPreconditionError("this round has no secure aggregation");
  return round_->SetSlices(slices);
}

void SecAggDriver::PrepareTaskLocked(v1::Task* task, TaskRecord* rec) {
  rec->codec = kSecAggCodec;
  rec->expected_size = round_->PayloadSize(rec->client_id);
  *task->mutable_secagg() = round_->TaskMessage();
}

std::optional<Status> SecAggDriver::AwaitLocked(Clock::time_point training_deadline) {
  const auto timeout = Seconds(ctx_.config().secure_aggregation.stage_timeout_s);
  auto stage_deadline = ctx_.clock().Now() + timeout;
  while (round_->stage() != SecAggRound::Stage::kDone) {
    if (ctx_.StoppingLocked()) return absl::CancelledError("stopped");
    const bool training = round_->stage() == SecAggRound::Stage::kMasked;
    const auto until = training ? training_deadline : stage_deadline;
    if (!round_->StageComplete() && ctx_.clock().Now() < until) {
      ctx_.WaitLocked(until);
      continue;
    }
    const char* closing = SecAggRound::StageName(round_->stage());
    auto next = round_->CloseStage();
    if (!next.ok()) {
      spdlog::warn("round {}: {}", ctx_.CurrentRoundLocked(), std::string(next.status().message()));
      return next.status();
    }
    spdlog::info("round {}: secure aggregation stage '{}' closed; '{}' next for {} clients",
                 ctx_.CurrentRoundLocked(), closing, SecAggRound::StageName(round_->stage()),
                 next->size());
    ctx_.SetPhaseLocked(
        absl::StrCat("secure aggregation: ", SecAggRound::StageName(round_->stage())));
    std::vector<std::pair<std::string, std::shared_ptr<ClientLink>>> to;
    for (auto& [cid, msg] : *next) {
      const std::string task_id = absl::StrCat("r", ctx_.CurrentRoundLocked(), "-", cid);
      if (msg.has_secagg_neighbours()) msg.mutable_secagg_neighbours()->set_task_id(task_id);
      if (msg.has_secagg_relay()) msg.mutable_secagg_relay()->set_task_id(task_id);
      if (msg.has_secagg_unmask()) msg.mutable_secagg_unmask()->set_task_id(task_id);
      if (const Session* s = ctx_.FindSessionLocked(cid)) {
        to.emplace_back(cid, s->link);
      } else {
        round_->Drop(cid);
      }
    }
    ctx_.mu().Unlock();  // never start gRPC operations under the mutex
    std::vector<std::string> unsent;
    for (auto& [cid, link] : to) {
      if (!link->Send((*next)[cid])) unsent.push_back(cid);
    }
    ctx_.mu().Lock();
    for (const auto& cid : unsent) {
      if (round_) round_->Drop(cid);
    }
    stage_deadline = ctx_.clock().Now() + timeout;
  }
  return absl::OkStatus();
}

bool SecAggDriver::TakeLocked(const v1::UploadHeader& h, const std::string& payload,
                              const TaskRecord& /*t*/, Status* status) {
  if (h.codec() != kSecAggCodec) return false;
  *status = round_ ? round_->AddMasked(h.client_id(), payload)
                   : absl::FailedPreconditionError("no secure aggregation this round");
  return true;
}

Status SecAggDriver::SubmitLocked(const v1::SecAggRequest& req) {
  if (!round_) return absl::FailedPreconditionError("this round has no secure aggregation");
  auto t = ctx_.TasksLocked().find(req.task_id());
  if (t == ctx_.TasksLocked().end() || t->second.client_id != req.client_id()) {
    return absl::FailedPreconditionError(absl::StrCat("task ", Printable(req.task_id()),
                                                      " was not given to client ",
                                                      Printable(req.client_id()), " this round"));
  }
  if (t->second.state == TaskState::kFailed) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", Printable(req.task_id()), " has failed"));
  }
  Status s;
  switch (req.stage_case()) {
    case v1::SecAggRequest::kKeys: s = round_->AddKeys(req.client_id(), req.keys()); break;
    case v1::SecAggRequest::kShares: s = round_->AddShares(req.client_id(), req.shares()); break;
    case v1::SecAggRequest::kReveal: s = round_->AddReveal(req.client_id(), req.reveal()); break;
    default: return absl::InvalidArgumentError("a secure-aggregation message without a stage");
  }
  if (s.ok()) {
    ctx_.Wake();
  } else {
    spdlog::warn("round {}: secure-aggregation message from {} refused: {}", ctx_.CurrentRoundLocked(),
                 req.client_id(), s.ToString());
  }
  return s;
}

void SecAggDriver::CloseLocked(int64_t /*round*/, RoundMetrics* /*m*/) {
  closed_ = std::move(round_);
}

StatusOr<SecAggDriver::Unmasked> SecAggDriver::TakeUnmasked() {
  const std::unique_ptr<SecAggRound> round = std::move(closed_);
  if (!round) return absl::InternalError("secure aggregation: no closed round to unmask");
  ASSIGN_OR_RETURN(SecAggRound::Result r, round->Finish());
  return Unmasked{std::move(r.sum), std::move(r.survivors), round->TaskMessage().max_weight()};
}

Status SecAggDriver::Fold(const ParameterSet& start, int64_t weight) {
  ASSIGN_OR_RETURN(Unmasked r, TakeUnmasked());
  if (weight <= 0) return absl::AbortedError("secure aggregation: no survivors' weight");
  // Clients sent n_u / max_weight * x_u: the weighted mean is the sum over the survivors'
  // total weight in the same units (or, with uniform weights, over their number).
  const double scale = UniformWeights() ? 1.0 / r.survivors.size() : static_cast<double>(r.max_weight) / weight;
  ParameterSet mean = start;
  size_t i = 0;
  for (auto& t : mean.mutable_tensors()) {
    for (float& v : t.values) v = static_cast<float>(r.sum[i++] * scale);
  }
  // Under distributed DP the weight is the number of clients in the sum (the DP
  // strategy's n); otherwise their examples.
  ctx_.Accumulate(ClientUpdate::Unnamed(
      ViewsOf(mean), UniformWeights() ? static_cast<int64_t>(r.survivors.size()) : weight));
  spdlog::info("secure aggregation: unmasked the sum of {} updates", r.survivors.size());
  return absl::OkStatus();
}

}  // namespace cleave
