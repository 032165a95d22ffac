#include "edge/edge.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "cleave/v1/cleave.pb.h"
#include "models/kinds.h"
#include "proto/train_config.h"

namespace cleave {

Status CheckEdgeConfig(const FederationConfig& c) {
  auto no = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an edge aggregator (--upstream) hands up its clients' plain weighted mean: ", why));
  };
  if (c.strategy.name != "fedavg" || c.strategy.server_lr != 1.0) {
    return no("strategy.name must be fedavg with server_lr 1 (the upstream applies its own rule)");
  }
  if (c.aggregation.rule != "mean") return no("aggregation.rule must be mean");
  if (c.dp.enabled) return no("dp belongs to the top coordinator");
  if (c.split.enabled()) return no("split.mode is not supported");
  if (c.scheduler.async()) return no("scheduler.mode must be sync");
  if (c.width.enabled && (c.width.ranks() || !c.width.distill.data.empty() || c.secure_aggregation.enabled)) {
    return no("width takes heterofl or fedrolex submodels here, without width.distill or secure_aggregation");
  }
  if (!c.model.personal.empty() || c.model.lora.rank > 0 ||
      ModelTraitsOf(c.model.name).has_private_tensors()) {
    return no("models with personal, frozen (LoRA) or private (interop) tensors are not supported");
  }
  return absl::OkStatus();
}

Edge::Edge(Server* server, ClientOptions upstream)
    : server_(server), upstream_(std::move(upstream)) {}

Status Edge::Run() {
  ASSIGN_OR_RETURN(const int64_t examples, server_->WaitForClients());
  ClientOptions o = upstream_;
  o.declared_examples = examples;
  o.aggregate = [this](const v1::Task& task,
                       const ParameterSet& model) -> StatusOr<ClientOptions::Aggregate> {
    if (ScriptedLoss(task.train().loss())) {
      return absl::FailedPreconditionError(
          "an edge aggregator does not forward a TorchScript loss");
    }
    ASSIGN_OR_RETURN(EdgeRound r,
                     server_->RunEdgeRound(model, FitFromProto(task.train()), task.train().seed()));
    spdlog::info("upstream round {}: {} participants, {} examples, handing up their mean",
                 task.round(), r.metrics.participants, r.examples);
    if (task.model().width() > 0 && task.has_secagg()) {
      return absl::FailedPreconditionError(
          "an upstream with width and secure aggregation: an edge's per-element weights cannot travel masked");
    }
    ClientOptions::Aggregate a{std::move(r.delta), r.examples, r.metrics.train_loss, std::move(r.weights)};
    if (a.weights.size() > 0 && task.model().width() <= 0) {
      return absl::FailedPreconditionError(
          "this edge's devices train width-scaled submodels: its upstream must run width too (each element's "
          "mean needs its weight there)");
    }
    return a;
  };
  spdlog::info("edge: {} examples across this server's clients; joining {}", examples,
               o.server);
  Client* client = nullptr;
  {
    MutexLock l(&mu_);
    if (stopping_) return absl::CancelledError("stopped");
    client_ = std::make_unique<Client>(std::move(o));
    client = client_.get();
  }
  Status s = client->Run();
  if (s.ok()) {
    server_->Finish("the upstream run ended");
  } else if (s.code() != absl::StatusCode::kCancelled) {
    server_->Finish(absl::StrCat("the upstream coordinator: ", s.message()));
  }
  return s;
}

void Edge::Stop() {
  server_->Stop();
  MutexLock l(&mu_);
  stopping_ = true;
  if (client_) client_->Stop();
}

}  // namespace cleave
