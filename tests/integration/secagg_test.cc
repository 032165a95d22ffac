// Secure aggregation over the wire: real clients, real gRPC. The server only ever sees
// masked updates, yet the round's model is plain FedAvg's up to quantization, with and
// without a client lost after training.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tests/integration/federation.h"

namespace cleave {
namespace {

constexpr char kJob[] = R"(
model: {name: mlp}
run: {rounds: 1, seed: 3}
data: {test_limit: 1000}
clients: {min: 5, quorum: 0.6, round_deadline_s: 60}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}
server: {heartbeat_s: 0.5, client_timeout_s: 30}
)";
constexpr char kSecAgg[] = "secure_aggregation: {k: 4, t: 3, clip: 1.0, bits: 16}\n";

// The global model after one round of 5 clients, the last of which crashes after
// training when `crash` is set.
ParameterSet RunOnce(bool secure, bool crash, RoundMetrics* metrics) {
  auto opts = Options(5, 5000);
  if (crash) opts[4].crash_after_training = [](int64_t) { return true; };
  Federation f;
  f.Start(std::string(kJob) + (secure ? kSecAgg : ""), std::move(opts));
  f.Join();
  EXPECT_TRUE(f.server_status.ok()) << f.server_status;
  EXPECT_EQ(f.server->History().size(), 1u);
  if (!f.server->History().empty()) *metrics = f.server->History()[0];
  return f.server->GlobalModel();
}

double MaxAbsDiff(const ParameterSet& a, const ParameterSet& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < a.tensors()[i].values.size(); ++j) {
      d = std::max<double>(d, std::abs(a.tensors()[i].values[j] - b.tensors()[i].values[j]));
    }
  }
  return d;
}

TEST(SecureAggregationTest, TheModelIsPlainFedAvgsUpToQuantization) {
  const ParameterSet initial = (*Model::Create({"mlp", "", 3}))->Parameters();
  for (bool crash : {false, true}) {
    RoundMetrics plain_m, secure_m;
    const ParameterSet plain = RunOnce(false, crash, &plain_m);
    const ParameterSet secure = RunOnce(true, crash, &secure_m);
    EXPECT_EQ(secure_m.participants, crash ? 4 : 5);
    EXPECT_EQ(secure_m.failures, crash ? 1 : 0);
    EXPECT_GT(MaxAbsDiff(plain, initial), 0.01) << "the round moved the model";
    // 16-bit levels over [-1, 1]: a step of 3e-5 per client, unbiased.
    EXPECT_LT(MaxAbsDiff(plain, secure), 5e-4) << (crash ? "with" : "without") << " a crash";
    EXPECT_GT(MaxAbsDiff(plain, secure), 0) << "the updates really went through quantization";
    EXPECT_NEAR(secure_m.test_accuracy, plain_m.test_accuracy, 0.01);
  }
}

// Width-scaled submodels under secure aggregation: five devices of two widths each mask
// their own submodel's delta alone (per-slice masking: a pair's masks cover the
// elements both hold), and the round's model is HeteroFL's per-element mean up to
// quantization, with and without a device (a half-width one) lost after training. A
// round whose widest rate has fewer devices than the masking's threshold t is refused:
// the server would read their sum alone.
TEST(SecureAggregationTest, SubmodelsOfTwoWidthsMaskTheirOwnSlices) {
  const std::string widths =
      "width: {method: fedrolex, clients: [{name: client-3, rate: 0.5}, {name: client-4, rate: 0.5}]}\n";
  const ParameterSet initial = (*Model::Create({"mlp", "", 3}))->Parameters();
  for (bool crash : {false, true}) {
    auto run = [&](bool secure, RoundMetrics* m) {
      auto opts = Options(5, 5000);
      if (crash) opts[4].crash_after_training = [](int64_t) { return true; };
      Federation f;
      f.Start(std::string(kJob) + widths + (secure ? kSecAgg : ""), std::move(opts));
      f.Join();
      EXPECT_TRUE(f.server_status.ok()) << f.server_status;
      EXPECT_EQ(f.server->History().size(), 1u);
      if (!f.server->History().empty()) *m = f.server->History()[0];
      return f.server->GlobalModel();
    };
    RoundMetrics plain_m, secure_m;
    const ParameterSet plain = run(false, &plain_m);
    const ParameterSet secure = run(true, &secure_m);
    EXPECT_EQ(secure_m.participants, crash ? 4 : 5);
    EXPECT_EQ(secure_m.widths.size(), crash ? 4u : 5u);
    EXPECT_LT(MaxAbsDiff(plain, secure), 5e-4) << (crash ? "with" : "without") << " a crash";
    EXPECT_GT(MaxAbsDiff(plain, secure), 0) << "the updates really went through quantization";
    // Each upload was its submodel's values, 4 bytes each (M = 2^32), not the whole layout.
    ModelSpec half{"mlp", "", 3};
    half.width = 0.5;
    const int64_t whole = initial.total_elements(), part = (*Model::Create(half))->Parameters().total_elements();
    EXPECT_LT(part, whole / 2);
    EXPECT_EQ(secure_m.update_bytes, 4 * (3 * whole + (crash ? 1 : 2) * part));
  }
  Federation f;
  f.Start(std::string(kJob) + kSecAgg +
              "width: {clients: [{name: client-1, rate: 0.5}, {name: client-2, rate: 0.5}, "
              "{name: client-3, rate: 0.5}, {name: client-4, rate: 0.5}]}\n",
          Options(5, 1000));
  f.Join();
  EXPECT_FALSE(f.server_status.ok());
  EXPECT_NE(f.server_status.ToString().find("secure_aggregation.t = 3"), std::string::npos) << f.server_status;
}

// Distributed DP: clients clip and add their share of the noise before masking; the
// server averages the unmasked sum with equal weights and accounts the round.
TEST(SecureAggregationTest, DistributedDpNoiseThroughSecureAggregation) {
  Federation f;
  f.Start(std::string(kJob) + kSecAgg +
              "dp: {noise: distributed, noise_multiplier: 1.0, clip: 0.5}\n",
          Options(5, 5000));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].participants, 5);
  EXPECT_GT(h[0].strategy_stats.at("epsilon"), 0);
  EXPECT_NEAR(h[0].strategy_stats.at("dp_noise_std"), 1.0 * 0.5 / 5, 1e-12);
  // The model moved by about the noise: per coordinate std z C / n = 0.1 (the clipped
  // updates add at most C / sqrt(numel) per coordinate on average).
  const ParameterSet initial = (*Model::Create({"mlp", "", 3}))->Parameters();
  const ParameterSet after = f.server->GlobalModel();
  double sq = 0;
  int64_t n = 0;
  for (size_t i = 0; i < after.size(); ++i) {
    for (size_t j = 0; j < after.tensors()[i].values.size(); ++j, ++n) {
      const double d = after.tensors()[i].values[j] - initial.tensors()[i].values[j];
      sq += d * d;
    }
  }
  EXPECT_NEAR(std::sqrt(sq / n), 0.1, 0.01);
}

}  // namespace
}  // namespace cleave
