// The Strategy interface as a library user's algorithm sees it through a real server
// (ServerOptions::strategy): its per-client instructions reach the clients' tasks, each
// result arrives with the client's identity and base model version, and its
// evaluation hook decides the round's federated-evaluation figures.
#include <gtest/gtest.h>

#include <mutex>

#include "server/server.h"
#include "tests/server/running_server.h"
#include "tests/server/test_peer.h"

namespace cleave {
namespace {

struct Seen {
  std::string id, name;
  int64_t base_version, staleness, weight;
  double train_loss;
};

// FedAvg, except that the first available client (by name) trains with its own lr and
// local steps, every result is recorded, and a round's evaluation is its worst client's.
class Recording : public Strategy {
 public:
  Recording(std::unique_ptr<Strategy> inner, std::mutex* mu, std::vector<Seen>* seen)
      : inner_(std::move(inner)), mu_(mu), seen_(seen) {}

  std::string name() const override { return "recording"; }
  RoundPlan ConfigureRound(int64_t round, const std::vector<std::string>& available,
                           const ClientSampler& sample) override {
    RoundPlan plan = inner_->ConfigureRound(round, available, sample);
    FitSettings own = plan.fit;
    own.lr = 0.25;
    own.local_steps = 3;
    plan.client_fit[available.front()] = own;
    return plan;
  }
  RoundPlan ConfigureBuffer(int64_t version) override { return inner_->ConfigureBuffer(version); }
  void BeginRound(const ParameterSet& global, int shards) override {
    inner_->BeginRound(global, shards);
  }
  void Accumulate(const ClientUpdate& u, int shard) override {
    {
      std::lock_guard<std::mutex> l(*mu_);
      seen_->push_back({u.client_id, u.client_name, u.base_version, u.staleness, u.weight,
                        u.train_loss});
    }
    inner_->Accumulate(u, shard);
  }
  int accumulated() const override { return inner_->accumulated(); }
  Status FinishRound(int failures, ParameterSet* global) override {
    return inner_->FinishRound(failures, global);
  }
  EvaluationSummary AggregateEvaluation(
      int64_t round, const std::vector<ClientEvaluationResult>& results) override {
    EvaluationSummary e = inner_->AggregateEvaluation(round, results);
    e.accuracy = e.accuracy_min;
    return e;
  }
  ParameterSet State() const override { return inner_->State(); }
  Status Restore(const ParameterSet& state) override { return inner_->Restore(state); }

 private:
  std::unique_ptr<Strategy> inner_;
  std::mutex* mu_;
  std::vector<Seen>* seen_;
};

ParameterSet Filled(const ParameterSet& layout, float v) {
  ParameterSet d = layout.ZerosLike();
  for (auto& t : d.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), v);
  return d;
}

class StrategyApiTest : public RunningServerTest {};

TEST_F(StrategyApiTest, InstructionsIdentitiesVersionsAndTheEvaluationHook) {
  std::mutex mu;
  std::vector<Seen> seen;
  ServerOptions o;
  o.config = TestConfig(R"(
run: {rounds: 2}
model: {name: mlp}
train: {lr: 0.05}
clients: {min: 2, quorum: 1.0, round_deadline_s: 60}
server: {client_timeout_s: 120, final_evaluation: false}
)");
  o.strategy = [&](const StrategyJob& c) -> StatusOr<std::unique_ptr<Strategy>> {
    ASSIGN_OR_RETURN(auto fedavg, CreateStrategy(c));
    return std::unique_ptr<Strategy>(new Recording(std::move(fedavg), &mu, &seen));
  };
  StartServerWith(std::move(o));
  const ParameterSet initial = server_->GlobalModel();
  TestPeer a(address_, 100), b(address_, 300);
  ASSERT_TRUE(b.Join("b"));  // joins first: the order of names, not of joins, decides
  ASSERT_TRUE(a.Join("a"));
  const std::string da = Filled(initial, 0.01f).Encode(), db = Filled(initial, -0.03f).Encode();
  for (int round = 1; round <= 2; ++round) {
    for (auto [peer, payload, examples, accuracy] :
         {std::tuple{&a, &da, 100, 0.6}, std::tuple{&b, &db, 300, 0.9}}) {
      auto task = peer->NextTask();
      ASSERT_TRUE(task);
      EXPECT_EQ(task->round(), round);
      const bool own = peer == &a;
      EXPECT_DOUBLE_EQ(task->train().lr(), own ? 0.25 : 0.05);
      EXPECT_EQ(task->train().local_steps(), own ? 3 : 0);
      v1::UploadHeader h = peer->Header(*task, examples);
      h.set_total_size(static_cast<int64_t>(payload->size()));
      h.set_train_loss(own ? 1.5 : 0.5);
      h.mutable_evaluation()->set_examples(20);
      h.mutable_evaluation()->set_accuracy(accuracy);
      h.mutable_evaluation()->set_loss(1.0);
      const grpc::Status s = peer->RawUpload(h, {*payload});
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  }
  ASSERT_TRUE(a.WaitRunEnded());
  runner_.join();
  ASSERT_TRUE(run_status_.ok()) << run_status_;

  ASSERT_EQ(seen.size(), 4u);
  for (size_t i = 0; i < seen.size(); ++i) {
    const Seen& r = seen[i];
    const bool is_a = r.name == "a";
    EXPECT_TRUE(is_a || r.name == "b") << r.name;
    EXPECT_EQ(r.id, (is_a ? a : b).welcome().client_id());
    EXPECT_EQ(r.base_version, static_cast<int64_t>(i / 2)) << "round " << i / 2 + 1;
    EXPECT_EQ(r.staleness, 0);
    EXPECT_EQ(r.weight, is_a ? 100 : 300);
    EXPECT_DOUBLE_EQ(r.train_loss, is_a ? 1.5 : 0.5);
  }
  const auto history = server_->History();
  ASSERT_EQ(history.size(), 2u);
  for (const auto& m : history) {
    EXPECT_EQ(m.client_eval.clients, 2);
    EXPECT_DOUBLE_EQ(m.client_eval.accuracy, 0.6) << "the hook's figure: the worst client";
    EXPECT_DOUBLE_EQ(m.client_eval.accuracy_max, 0.9);
  }
  // Two rounds of the same FedAvg mean: (100 * 0.01 + 300 * -0.03) / 400 = -0.02 each.
  const ParameterSet after = server_->GlobalModel();
  for (size_t i = 0; i < after.size(); ++i) {
    for (size_t j = 0; j < after.tensors()[i].values.size(); ++j) {
      ASSERT_NEAR(after.tensors()[i].values[j], initial.tensors()[i].values[j] - 0.04f, 1e-6);
    }
  }
}

}  // namespace
}  // namespace cleave
