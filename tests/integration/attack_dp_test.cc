// Attack simulation and DP-FedAvg through a real federation.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "client/transfer.h"
#include "privacy/accountant.h"
#include "tests/integration/federation.h"
#include "tests/server/test_peer.h"

namespace cleave {
namespace {

std::string Job(int rounds, int clients) {
  return "model: {name: mlp}\nrun: {rounds: " + std::to_string(rounds) + ", seed: 3}\n" +
         "data: {test_limit: 500}\nclients: {min: " + std::to_string(clients) +
         ", quorum: 1.0, round_deadline_s: 60}\n" +
         "train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}\n" +
         "server: {heartbeat_s: 0.5, client_timeout_s: 30}\n";
}

// The change one client's update made to the model, flattened.
std::vector<double> Step(const std::string& attack) {
  auto opts = Options(1, 1000);
  opts[0].attack = attack;
  Federation f;
  f.Start(Job(1, 1), std::move(opts));
  f.Join();
  EXPECT_TRUE(f.server_status.ok()) << f.server_status;
  const ParameterSet initial = (*Model::Create({"mlp", "", 3}))->Parameters();
  const ParameterSet after = f.server->GlobalModel();
  std::vector<double> d;
  for (size_t i = 0; i < after.size(); ++i) {
    for (size_t j = 0; j < after.tensors()[i].values.size(); ++j) {
      d.push_back(static_cast<double>(after.tensors()[i].values[j]) - initial.tensors()[i].values[j]);
    }
  }
  return d;
}

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

TEST(AttackTest, AttackersSendWhatTheySay) {
  const auto honest = Step("");
  const double hh = Dot(honest, honest);
  ASSERT_GT(hh, 0);
  const auto flipped = Step("sign-flip");
  for (size_t i = 0; i < honest.size(); i += 97) EXPECT_NEAR(flipped[i], -honest[i], 1e-5);
  const auto gaussian = Step("gaussian");
  EXPECT_NEAR(Dot(gaussian, gaussian) / gaussian.size(), 1.0, 0.05) << "N(0, 1) per coordinate";
  const auto ipm = Step("ipm");  // -3 x its own honest update
  for (size_t i = 0; i < honest.size(); i += 97) EXPECT_NEAR(ipm[i], -3 * honest[i], 1e-5);
  const auto alie = Step("alie");  // mu - 1.5 sigma: near the benign update, but not it
  std::vector<double> diff(honest.size());
  for (size_t i = 0; i < diff.size(); ++i) diff[i] = alie[i] - honest[i];
  EXPECT_GT(Dot(alie, honest), 0);
  EXPECT_GT(Dot(diff, diff), 0.01 * hh);
  for (size_t i = 0; i < honest.size(); i += 97) EXPECT_LE(alie[i], honest[i] + 1e-6) << "mu - 1.5 sigma";
  Client bad([] {
    ClientOptions o;
    o.attack = "nonsense";
    o.insecure = true;
    return o;
  }());
  EXPECT_EQ(bad.Run().code(), absl::StatusCode::kInvalidArgument);
}

// The weight-capture attack of issue 13 at the scale of accuracy: four honest devices on
// Fashion-MNIST and one (a TestPeer) that declares 10^12 examples at Join and in every
// upload, and uploads +1.0 in every coordinate each round.
struct AttackedRun {
  Status status;
  std::vector<RoundMetrics> history;
};

AttackedRun RunWithWeightCapture(const std::string& aggregation) {
  constexpr int64_t kHuge = 1000000000000;
  Federation f;
  f.Start(Job(3, 5) + aggregation, Options(4, 4000));
  std::thread attacker([&f] {
    TestPeer evil("127.0.0.1:" + std::to_string(f.server->port()), kHuge);
    ASSERT_TRUE(evil.Join("evil"));
    ParameterSet plus_one = f.server->GlobalModel().ZerosLike();
    for (auto& t : plus_one.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), 1.0f);
    const std::string payload = plus_one.Encode();
    while (auto task = evil.NextTask(60)) {
      EXPECT_TRUE(UploadPayload(evil.stub(), evil.Header(*task, kHuge), payload).ok());
    }
  });
  f.Join();
  attacker.join();
  const ParameterSet model = f.server->GlobalModel();
  for (const auto& t : model.tensors()) {
    for (float v : t.values) EXPECT_TRUE(std::isfinite(v)) << t.name;
  }
  return {f.server_status, f.server->History()};
}

// Without the weight cap the attacker owns the mean: accuracy falls to chance in one
// round and the honest clients' training then fails. A robust rule over the capped
// weights outvotes it: every round commits with all five updates and the federation is
// as accurate as without the attacker. (With the mean, +1.0 everywhere ruins the model
// at any weight it is allowed; docs/security.md.)
TEST(HostileFederationTest, ARobustRuleKeepsAccuracyAgainstWeightCapture) {
  const auto clean = RunToEnd(Job(3, 4), Options(4, 4000));
  ASSERT_EQ(clean.size(), 3u);
  const double clean_accuracy = clean.back().test_accuracy;
  EXPECT_GT(clean_accuracy, 0.75);

  const AttackedRun uncapped = RunWithWeightCapture("aggregation: {max_weight_ratio: 0}\n");
  ASSERT_FALSE(uncapped.history.empty());
  EXPECT_LT(uncapped.history[0].test_accuracy, 0.2) << "the attack must be real";

  for (const std::string rule : {"{rule: median}", "{rule: trimmed_mean, f: 1}"}) {
    const AttackedRun r = RunWithWeightCapture("aggregation: " + rule + "\n");
    EXPECT_TRUE(r.status.ok()) << rule << ": " << r.status;
    ASSERT_EQ(r.history.size(), 3u) << rule;
    for (const auto& m : r.history) EXPECT_EQ(m.participants, 5) << rule;
    EXPECT_GT(r.history.back().test_accuracy, clean_accuracy - 0.03) << rule;
  }
}

// A DP job's metrics carry the accountant's epsilon, and dp.target_epsilon ends the run
// before a round would exceed it.
TEST(DpFederationTest, ReportsEpsilonAndStopsAtTheTarget) {
  const double one = dp::ComputeEpsilon(1.0, 1.0, 1, 1e-5)->epsilon;
  const double two = dp::ComputeEpsilon(1.0, 1.0, 2, 1e-5)->epsilon;
  Federation f;
  f.Start(Job(5, 2) + "dp: {noise_multiplier: 1.0, clip: 1.0, target_epsilon: " +
              std::to_string((one + two) / 2) + "}\n",
          Options(2, 1000));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 1u) << "the second round would exceed the target";
  EXPECT_NEAR(h[0].strategy_stats.at("epsilon"), one, 1e-9);
  EXPECT_EQ(h[0].strategy_stats.at("delta"), 1e-5);
  EXPECT_NEAR(h[0].strategy_stats.at("dp_noise_std"), 1.0 * 1.0 / 2, 1e-12);
  for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace cleave
