#include "core/config.h"

#include <gtest/gtest.h>

#include <filesystem>

namespace cleave {
namespace {

TEST(ConfigTest, EmptyConfigGivesDefaults) {
  auto c = JobConfig::Parse("", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->strategy.name, "fedavg");
  EXPECT_EQ(c->model.name, "lenet5");
  EXPECT_DOUBLE_EQ(c->strategy.server_lr, 1.0);
}

TEST(ConfigTest, ReadsValues) {
  auto c = JobConfig::Parse(R"(
run: {name: x, rounds: 7, seed: 3}
clients: {min: 4, per_round: 2, quorum: 1.0, round_deadline_s: 9}
train: {local_epochs: 2, batch_size: 16, lr: 0.1, momentum: 0.5, weight_decay: 0.01}
strategy: {name: fedprox, proximal_mu: 0.01}
)",
                            "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->run.rounds, 7);
  EXPECT_EQ(c->clients.per_round, 2);
  EXPECT_EQ(c->train.batch_size, 16);
  EXPECT_DOUBLE_EQ(c->strategy.proximal_mu, 0.01);
}

TEST(ConfigTest, AdaptiveStrategiesDefaultToSmallerServerLr) {
  auto c = JobConfig::Parse("strategy: {name: fedadam}", "");
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c->strategy.server_lr, 0.1);
  c = JobConfig::Parse("strategy: {name: fedadam, server_lr: 0.5}", "");
  EXPECT_DOUBLE_EQ(c->strategy.server_lr, 0.5);
}

TEST(ConfigTest, RejectsUnknownKeysAndBadValues) {
  auto expect_error = [](const std::string& yaml, const std::string& needle) {
    auto c = JobConfig::Parse(yaml, "");
    ASSERT_FALSE(c.ok()) << yaml;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status();
  };
  expect_error("train: {lrr: 1}", "train.lrr");
  expect_error("bogus: 1", "config.bogus");
  expect_error("train: {lr: -1}", "train.lr");
  expect_error("train: {lr: abc}", "train.lr");
  expect_error("clients: {quorum: 1.5}", "clients.quorum");
  expect_error("strategy: {name: fedfoo}", "fedfoo");
  expect_error("model: {name: torchscript}", "model.path");
  expect_error("server: {chunk_bytes: 8000000}", "server.chunk_bytes");
  expect_error("run: [1, 2", "YAML");
}

TEST(ConfigTest, ResolvesTorchScriptPathAgainstConfigDir) {
  auto c = JobConfig::Parse("model: {name: torchscript, path: m.pt}", "/etc/cleave");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->model.path, "/etc/cleave/m.pt");
}

TEST(ConfigTest, EveryShippedExampleLoads) {
  int n = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(CLEAVE_SOURCE_DIR) + "/deploy/examples")) {
    if (e.path().extension() != ".yaml") continue;
    auto c = JobConfig::Load(e.path().string());
    EXPECT_TRUE(c.ok()) << c.status();
    ++n;
  }
  EXPECT_GE(n, 3);
}

}  // namespace
}  // namespace cleave
