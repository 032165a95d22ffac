// Client: an edge aggregator's task: a round of its own clients, their mean handed up.
#include "client/client_impl.h"

#include "proto/edge_weights.h"
#include "proto/train_config.h"

namespace cleave {

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
  auto global = models.FetchGlobal(stub, w, task);
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
                     uploader.Upload(stub, w, task, r.delta, r.examples, r.loss, seconds, nullptr));
  }
  ++tasks_done;
  spdlog::info("round {}: edge round of {} examples in {:.1f}s (loss {:.4f}), partial mean "
               "uploaded{}{}",
               task.round(), r.examples, seconds, r.loss, secagg ? " masked" : "",
               reply.duplicate() ? " (duplicate)" : "");
  return absl::OkStatus();
}

}  // namespace cleave
