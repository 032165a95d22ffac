#include "job/job.h"

#include <gtest/gtest.h>

#include <cmath>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "aggregation/registry.h"
#include "aggregation/staleness.h"
#include "client/attacks.h"
#include "job/job.h"
#include "models/names.h"
#include "server/rounds/round_registry.h"
#include "server/rounds/selection.h"
#include "split/names.h"

namespace cleave {
namespace {

TEST(ConfigTest, EmptyConfigGivesDefaults) {
  auto c = ParseJob("", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->strategy.name, "fedavg");
  EXPECT_EQ(c->model.name, "lenet5");
  EXPECT_DOUBLE_EQ(c->strategy.server_lr, 1.0);
}

TEST(ConfigTest, ReadsValues) {
  auto c = ParseJob(R"(
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
  auto c = ParseJob("strategy: {name: fedadam}", "");
  ASSERT_TRUE(c.ok());
  EXPECT_DOUBLE_EQ(c->strategy.server_lr, 0.1);
  c = ParseJob("strategy: {name: fedadam, server_lr: 0.5}", "");
  EXPECT_DOUBLE_EQ(c->strategy.server_lr, 0.5);
}

TEST(ConfigTest, RejectsUnknownKeysAndBadValues) {
  auto expect_error = [](const std::string& yaml, const std::string& needle) {
    auto c = ParseJob(yaml, "");
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
  expect_error("split: {mode: splitfed}", "split.mode");
  expect_error("split: {mode: sl, cut: 0}", "split.cut");
  expect_error("split: {mode: sl, cut: deep}", "split.cut");
  expect_error("split: {mode: sl, window: 0}", "split.window");
  expect_error("split: {mode: ushaped, tail: 0}", "split.tail");
  expect_error("split: {mode: sfl-v2, ushaped: true}", "split.ushaped applies to split.mode: pipeline");
  // Width-scaled submodels.
  expect_error("width: {rate: 0}", "width.rate");
  expect_error("width: {method: fedavg}", "width.method");
  expect_error("width: {clients: [{rate: 0.5}]}", "width.clients[].name");
  expect_error("model: {name: vgg}\nwidth: {rate: 0.5}", "mlp, lenet5, cnn, resnet, gpt or hf");
  EXPECT_TRUE(ParseJob("model: {name: gpt}\nwidth: {method: fedrolex, rate: 0.5}\n", "").ok());
  expect_error("model: {name: gpt}\nwidth: {rate: 0.5, distill: {data: \"fmnist:/x\"}}", "FedDF distils class logits");
  expect_error("model: {name: resnet}\nwidth: {rate: 0.5}", "model.batch_norm: static");
  expect_error("model: {name: lenet5, batch_norm: static}", "used with model.name resnet");
  expect_error("model: {name: resnet, batch_norm: frozen}", "model.batch_norm");
  EXPECT_TRUE(ParseJob("model: {name: resnet, batch_norm: static}\nwidth: {rate: 0.5}\n", "").ok());
  expect_error("width: {rate: 0.5}\nsplit: {mode: sfl-v2}", "do not combine with split learning");
  EXPECT_TRUE(ParseJob("width: {method: fedrolex, rate: 0.5}\nsecure_aggregation: {}\n", "").ok());
  EXPECT_TRUE(ParseJob("width: {method: fedrolex, rate: 0.5}\nscheduler: {mode: async}\n", "").ok());
  expect_error(std::string("model: {name: gpt, lora: {rank: 8}}\n") + "width: {method: flexlora, rate: 0.5}\nscheduler: {mode: async}",
               "async with LoRA ranks");
  expect_error("width: {rate: 0.5}\nscheduler: {mode: gossip}", "scheduler.mode: gossip");
  expect_error(std::string("model: {name: gpt, lora: {rank: 8}}\n") + "width: {method: hetlora, rate: 0.5}\nsecure_aggregation: {}",
               "secure_aggregation with LoRA ranks");
  expect_error("width: {rate: 0.5}\nsecure_aggregation: {}\ndp: {noise: distributed, clip: 1}", "dp under secure_aggregation");
  EXPECT_TRUE(ParseJob("model: {name: cnn}\nwidth: {method: fedrolex, rate: 0.25, clients: [{name: big, rate: 1}]}\n", "").ok());
  // Robust rules: per element (median, trimmed_mean, norm_bound), not those that compare
  // whole updates, nor on LoRA ranks.
  EXPECT_TRUE(ParseJob("width: {rate: 0.5}\naggregation: {rule: median}\n", "").ok());
  expect_error("width: {rate: 0.5}\naggregation: {rule: krum, f: 1}", "compares whole updates");
  // Codecs: not with FedRolex's rolling windows, nor EF21's server estimate.
  expect_error("width: {method: fedrolex}\ncompression: {update: int8}", "fedrolex");
  expect_error("width: {rate: 0.5}\ncompression: {update: \"topk:0.1:ef21\"}", ":ef21");
  EXPECT_TRUE(ParseJob("width: {rate: 0.5}\ncompression: {update: \"topk:0.1\"}\n", "").ok());
  // DP-FedAvg: with HeteroFL and FedRolex, not on LoRA ranks nor beside FedDF.
  EXPECT_TRUE(ParseJob("width: {method: fedrolex, rate: 0.5}\ndp: {clip: 1}\n", "").ok());
  expect_error("width: {rate: 0.5, distill: {data: \"fmnist:/x\"}}\ndp: {clip: 1}", "width.distill");
  expect_error(std::string("model: {name: gpt, lora: {rank: 8}}\n") + "width: {method: hetlora, rate: 0.5}\ndp: {clip: 1}",
               "dp on LoRA ranks");
  // Interoperable architectures: known bases, no server-side evaluation, no split.
  const std::string interop = "model: {name: interop, interop: {base: cnn, clients: [{name: a, base: mlp}]}}\n";
  expect_error(interop, "the server holds no device's base");
  expect_error("model: {name: interop, interop: {base: vgg}}\ndata: {test: \"\"}", "model.interop.base");
  expect_error("model: {name: interop, interop: {clients: [{name: a, base: gpt}]}}\ndata: {test: \"\"}",
               "model.interop.clients[].base");
  expect_error(interop + "data: {test: \"\"}\nsplit: {mode: sfl-v2}", "split.cut");
  expect_error(interop + "data: {test: \"\"}\nsplit: {mode: pipeline, cut: 2, devices: 2}", "split.mode pipeline");
  EXPECT_TRUE(ParseJob(interop + "data: {test: \"\"}\nsplit: {mode: ushaped, cut: 2}\n", "").ok());
  EXPECT_TRUE(ParseJob(interop + "data: {test: \"\"}\nsplit: {mode: sfl-v2, cut: 2}\n", "").ok());
  EXPECT_TRUE(ParseJob(interop + "data: {test: \"\"}\n", "").ok());
  // Per-device LoRA ranks: a LoRA decoder, and rates that give whole ranks.
  const std::string lora = "model: {name: gpt, lora: {rank: 8}}\n";
  expect_error("width: {method: hetlora, rate: 0.5}", "model.lora");
  expect_error(lora + "width: {method: flexlora, rate: 0.3}", "a whole fraction k / 8");
  expect_error(lora + "width: {method: hetlora, clients: [{name: a, rate: 0.0625}]}", "width.clients[].rate");
  expect_error(lora + "width: {method: heterofl, rate: 0.5}", "on LoRA adapters with width.method hetlora");
  EXPECT_TRUE(ParseJob(lora + "width: {method: flexlora, rate: 0.25, clients: [{name: big, rate: 1}]}\n", "").ok());
  expect_error("split: {mode: sl}\nstrategy: {name: fedprox}", "fedprox is not supported");
  expect_error("local: {profiles: [{slowdown: 0.5}]}", "slowdown");
  expect_error("clients: {selection: fastest}", "clients.selection");
  expect_error("clients: {selection: oort, oort_epsilon: 2}", "clients.oort_epsilon");
  expect_error("clients: {selection: oort, oort_alpha: -1}", "clients.oort_alpha");
  expect_error("clients: {selection: oort}\nsplit: {mode: sl}", "split.mode assigns its own");
  expect_error("clients: {selection: oort}\ndp: {noise_multiplier: 1, clip: 1}",
               "assumes uniformly sampled clients");
  expect_error("scheduler: {mode: fedbuff}", "scheduler.mode");
  expect_error("scheduler: {mode: async, buffer_size: 0}", "scheduler.buffer_size");
  expect_error("scheduler: {mode: async, max_staleness: -1}", "scheduler.max_staleness");
  expect_error("scheduler: {mode: async, max_client_share: 0}", "scheduler.max_client_share");
  expect_error("scheduler: {mode: async, max_client_share: 1.5}", "scheduler.max_client_share");
  expect_error("scheduler: {mode: async, staleness: linear}", "scheduler.staleness");
  expect_error("scheduler: {mode: async, max_staleness: 3, target_staleness: 4}",
               "scheduler.target_staleness must be in [0, scheduler.max_staleness=3]");
  expect_error("scheduler: {target_staleness: 2}", "it needs scheduler.mode: async");
  expect_error("scheduler: {mode: async, min_local_steps: 0}", "scheduler.min_local_steps");
  expect_error("scheduler: {mode: async, window: 3}", "scheduler.window");
  expect_error("scheduler: {mode: async}\nsplit: {mode: sl}", "split.mode runs synchronous");
  expect_error("scheduler: {mode: async}\nsecure_aggregation: {}", "an async buffer has no");
  expect_error("scheduler: {mode: async}\nclients: {selection: oort}", "must be uniform");
  expect_error("scheduler: {mode: async}\ncompression: {update: \"topk:0.1:ef21\"}",
               "staleness-scaled async updates");
  expect_error("scheduler: {mode: async}\naggregation: {rule: fltrust, root_data: \"fmnist:/x\"}",
               "fltrust");
  expect_error("local: {profiles: [{uplink: 3}]}", "local.profiles[].uplink");
  expect_error("compression: {uplink: int8}", "compression.uplink");
  expect_error("auth: {token: abc}", "auth.token");
  expect_error("secure_aggregation: {k: 4, t: 5}", "secure_aggregation.t");
  expect_error("secure_aggregation: {t: 1}", "secure_aggregation.t");
  expect_error("secure_aggregation: {bits: 16, modulus: 1000}", "secure_aggregation.modulus");
  expect_error("secure_aggregation: {clip: 0}", "secure_aggregation.clip");
  expect_error("secure_aggregation: {}\nsplit: {mode: sfl-v2}", "only split.mode: pipeline masks");
  EXPECT_TRUE(ParseJob("secure_aggregation: {k: 3, t: 2}\nsplit: {mode: pipeline, cut: 2, devices: 2}\n"
                       "train: {batch_size: 32}\n", "").ok());
  expect_error("secure_aggregation: {}\ncompression: {update: int8}", "compression.update");
  expect_error("compression: {update: \"topk:0.01:ef21\"}\ndp: {}", "EF21");
  expect_error("compression: {update: \"topk:0.01:ef21\"}\naggregation: {rule: median}", "EF21");
  expect_error("compression: {update: \"topk:0.01:ef21\"}\nsplit: {mode: sfl-v2}", "not split");
  expect_error("dp: {noise_multiplier: 0}", "dp.noise_multiplier");
  expect_error("dp: {noise: local}", "dp.noise");
  expect_error("dp: {noise: distributed}", "needs secure_aggregation");
  expect_error("dp: {}\naggregation: {rule: median}", "do not combine");
  expect_error("aggregation: {rule: average}", "aggregation.rule");
  expect_error("aggregation: {rule: fltrust}", "aggregation.root_data");
  expect_error("aggregation: {rule: norm_bound}", "aggregation.max_norm");
  expect_error("aggregation: {rule: median}\nsecure_aggregation: {}", "secure aggregation hides");
  expect_error("local: {attack: poison, attackers: 1}", "local.attack");
  expect_error("split: {mode: sfl-v2, nopeek: -1}", "split.nopeek");
  expect_error("split: {mode: sfl-v2, label_epsilon: -1}", "split.label_epsilon");
  expect_error("server: {record_updates: -1}", "server.record_updates");
  expect_error("split: {mode: sfl-v2, max_reconstruction_ssim: 1.5}", "split.max_reconstruction_ssim");
  expect_error("split: {mode: sfl-v2, cut: 2, max_reconstruction_ssim: 0.5}", "needs split.cut: auto");
  expect_error("split: {mode: sfl-v2, max_token_recovery: 2}", "split.max_token_recovery");
  expect_error("split: {mode: sfl-v2, max_reconstruction_ssim: 0.5, max_token_recovery: 0.5}", "set the one for the model");
  expect_error("split: {mode: sfl-v2, cut: 1, hijack: dlg}", "split.hijack");
  expect_error("split: {mode: sfl-v2, hijack: fsha}", "at a fixed split.cut");
  expect_error("split: {mode: ushaped, cut: 1, hijack: fsha}", "in split.mode sl, sfl-v1 or sfl-v2");
  expect_error("tls: {cert: s.crt}", "tls.cert and tls.key");
  expect_error("tls: {cert: s.crt, key: s.key, reload_s: 0}", "tls.reload_s");
  expect_error("tls: {certificate: s.crt}", "tls.certificate");
  // Values that YAML reads as numbers but no setting means.
  expect_error("train: {lr: .inf}", "train.lr must be a finite number");
  expect_error("train: {lr: .nan}", "train.lr must be a finite number");
  expect_error("clients: {round_deadline_s: -.inf}", "clients.round_deadline_s");
  expect_error("run: {rounds: 0}", "run.rounds");
  expect_error("run: {rounds: -4}", "run.rounds");
  // A key given twice: yaml-cpp would silently keep one of them.
  expect_error("train: {lr: 0.1, lr: 5}", "duplicate config key train.lr");
  expect_error("train: {lr: 0.1}\ntrain: {momentum: 0}", "duplicate config key config.train");
  expect_error("aggregation: {weighting: trust}", "aggregation.weighting");
  expect_error("aggregation: {max_weight_ratio: 0.5}", "aggregation.max_weight_ratio");
  expect_error("aggregation: {max_client_examples: -1}", "aggregation.max_client_examples");
  expect_error("server: {max_update_abs: 0}", "server.max_update_abs");
  expect_error("server: {upload_idle_timeout_s: 0}", "server.upload_idle_timeout_s");
  expect_error("server: {max_sessions: -1}", "server.max_sessions");
  expect_error("tls: {cert: s.crt, key: s.key, revoked: r.txt}", "needs tls.mutual");
  // Models, data and local training (issue 14).
  expect_error("model: {input: []}", "model.input");
  expect_error("model: {input: [3, 0, 32]}", "model.input");
  expect_error("model: {input: [1, 2, 3, 4]}", "model.input");
  expect_error("model: {classes: 0}", "model.classes");
  expect_error("local: {holdout: 0.95}", "local.holdout");
  expect_error("train: {optimizer: lbfgs}", "train.optimizer");
  expect_error("train: {nesterov: true, momentum: 0}", "train.nesterov");
  expect_error("train: {optimizer: adam, nesterov: true}", "train.nesterov");
  expect_error("train: {clip_norm: -1}", "train.clip_norm");
  expect_error("train: {label_smoothing: 1}", "train.label_smoothing");
  expect_error("train: {local_steps: -5}", "train.local_steps");
  expect_error("train: {schedule: exponential}", "train.schedule");
  expect_error("train: {step_gamma: 0}", "train.step_gamma");
  expect_error("train: {lr: 0.1, lr_min: 0.2}", "train.lr_min");
  expect_error("split: {mode: sl}\ntrain: {loss: bce}\nmodel: {classes: 1}",
               "cross_entropy with split learning");
  EXPECT_TRUE(ParseJob("split: {mode: sl}\ntrain: {optimizer: adamw, clip_norm: 1, "
                               "label_smoothing: 0.1, local_steps: 5}\n",
                               "")
                  .ok());
  expect_error("train: {loss: hinge}", "train.loss");
  expect_error("train: {loss: torchscript}", "train.loss_path");
  expect_error("train: {loss_path: focal.pt}", "train.loss_path");
  expect_error("train: {loss: mse}", "model.classes");  // regression has one output
  expect_error("train: {loss: bce, label_smoothing: 0.1}\nmodel: {classes: 1}",
               "train.label_smoothing");
  // Personal layers: not with split learning, nor with a server that evaluates a model
  // holding none of the clients' personal tensors.
  expect_error("model: {personal: [\"fc.*\"]}", "without server-side evaluation");
  expect_error("model: {personal: [\"fc.*\"]}\ndata: {test: \"\"}\nsplit: {mode: sl}",
               "empty with split learning");
  expect_error("model: {personal: [\"\"]}\ndata: {test: \"\"}", "model.personal");
  auto personal = ParseJob("model: {personal: [\"fc.*\", \"*.bias\"]}\ndata: {test: \"\"}", "");
  ASSERT_TRUE(personal.ok()) << personal.status();
  EXPECT_EQ(personal->model.personal, (std::vector<std::string>{"fc.*", "*.bias"}));
  // A TorchScript loss's path is relative to the config file, like a model's.
  auto scripted = ParseJob("train: {loss: torchscript, loss_path: focal.pt}", "/etc/jobs");
  ASSERT_TRUE(scripted.ok()) << scripted.status();
  EXPECT_EQ(scripted->train.loss_path, "/etc/jobs/focal.pt");
}

TEST(ConfigTest, ModelDataAndTrainingKeys) {
  auto c = ParseJob(R"(
model: {name: resnet, input: [3, 32, 32], classes: 100}
data: {test: ""}
train: {optimizer: adamw, lr: 0.001, weight_decay: 0.05, local_steps: 50, clip_norm: 1.0,
        label_smoothing: 0.1, schedule: cosine, warmup_rounds: 2, lr_min: 0.0001}
local: {data: "cifar100:/data/c,labels=coarse", holdout: 0.1}
)", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.input, (std::vector<int64_t>{3, 32, 32}));
  EXPECT_EQ(c->model.classes, 100);
  EXPECT_FALSE(c->server.evaluate) << "no test set, no server evaluation";
  EXPECT_EQ(c->train.optimizer, "adamw");
  EXPECT_EQ(c->train.local_steps, 50);
  EXPECT_DOUBLE_EQ(c->local.holdout, 0.1);
  // The warm-up rises linearly to lr; the cosine then falls towards lr_min over the 8
  // rounds left (as CosineAnnealingLR with T_max 8: lr_min would be the 9th).
  EXPECT_DOUBLE_EQ(ScheduledLr(c->train, 1, 10), 0.0005);
  EXPECT_DOUBLE_EQ(ScheduledLr(c->train, 2, 10), 0.001);
  EXPECT_DOUBLE_EQ(ScheduledLr(c->train, 3, 10), 0.001);
  EXPECT_NEAR(ScheduledLr(c->train, 10, 10), 0.0001 + 0.0009 * (1 + std::cos(M_PI * 7 / 8)) / 2,
              1e-15);
}

TEST(ConfigTest, ReadsLanguageModelKeys) {
  auto c = ParseJob(R"(
model:
  name: gpt
  gpt: {vocab: 512, context: 64, layers: 2, heads: 2, dim: 32, tie: true}
  weights: base.safetensors
  lora: {rank: 8, alpha: 32, targets: [attn.c_attn], dropout: 0.1}
strategy: {name: diloco}
)", "/jobs");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.gpt.vocab, 512);
  EXPECT_TRUE(c->model.gpt.tie);
  EXPECT_EQ(c->model.weights, "/jobs/base.safetensors");
  EXPECT_EQ(c->model.lora.rank, 8);
  EXPECT_EQ(c->model.lora.targets, (std::vector<std::string>{"attn.c_attn"}));
  EXPECT_DOUBLE_EQ(c->strategy.server_lr, 0.7);
  for (const auto& [yaml, error] : std::vector<std::pair<std::string, std::string>>{
           {"model: {name: gpt, gpt: {dim: 30, heads: 4}}", "model.gpt.dim must be"},
           {"model: {name: gpt, gpt: {vocab: 1}}", "model.gpt.vocab must be"},
           {"model: {name: gpt, gpt: {tie: true}}\nsplit: {mode: sfl-v2}", "model.gpt.tie must be false"},
           {"model: {name: lenet5, lora: {rank: 4}}", "model.lora must be used with model.name gpt or hf"},
           {"model: {name: gpt, lora: {rank: 4, targets: [attn.q]}}", "model.lora.targets: unknown 'attn.q'"},
           {"model: {name: gpt, lora: {rank: 4, dropout: 1}}", "model.lora.dropout must be in [0, 1)"},
           {"model: {name: gpt, gpt: {layers: 2, depth: 3}}", "unknown config key model.gpt.depth"},
       }) {
    auto bad = ParseJob(yaml, "");
    ASSERT_FALSE(bad.ok()) << yaml;
    EXPECT_NE(bad.status().message().find(error), std::string::npos) << bad.status();
  }
}

TEST(ConfigTest, ReadsHostileClientDefenses) {
  auto c = ParseJob(R"(
aggregation: {weighting: equal, max_weight_ratio: 0, max_client_examples: 500}
server: {evaluate: false, max_update_abs: 100, upload_idle_timeout_s: 5, max_sessions: 9}
)", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->aggregation.weighting, "equal");
  EXPECT_EQ(c->aggregation.max_weight_ratio, 0);
  EXPECT_EQ(c->aggregation.max_client_examples, 500);
  EXPECT_FALSE(c->server.evaluate);
  EXPECT_EQ(c->server.max_update_abs, 100);
  EXPECT_EQ(c->server.upload_idle_timeout_s, 5);
  EXPECT_EQ(c->server.max_sessions, 9);
  auto d = ParseJob("", "");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->aggregation.weighting, "examples");
  EXPECT_EQ(d->aggregation.max_weight_ratio, 3);
  EXPECT_TRUE(d->server.evaluate);
}

TEST(ConfigTest, ReadsSplitAndDeviceProfiles) {
  auto c = ParseJob(
      "split: {mode: ushaped, cut: 3, tail: 2, window: 4}\n"
      "local: {profiles: [{uplink_mbps: 2, downlink_mbps: 8, slowdown: 3, "
      "memory_limit_mb: 64}, {}]}\n",
      "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->split.enabled());
  EXPECT_EQ(c->split.mode, "ushaped");
  EXPECT_EQ(c->split.cut, 3);
  EXPECT_EQ(c->split.tail, 2);
  EXPECT_EQ(c->split.window, 4);
  ASSERT_EQ(c->local.profiles.size(), 2u);
  EXPECT_EQ(c->local.profiles[0].uplink_mbps, 2);
  EXPECT_EQ(c->local.profiles[0].downlink_mbps, 8);
  EXPECT_EQ(c->local.profiles[0].slowdown, 3);
  EXPECT_EQ(c->local.profiles[0].memory_limit_mb, 64);
  EXPECT_EQ(c->local.profiles[1].slowdown, 1);
  auto automatic = ParseJob("split: {mode: sfl-v1, cut: auto}", "");
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ(automatic->split.cut, 0);
  EXPECT_FALSE(ParseJob("", "")->split.enabled());
}

TEST(ConfigTest, ResolvesTorchScriptPathAgainstConfigDir) {
  auto c = ParseJob("model: {name: torchscript, path: m.pt}", "/etc/cleave");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->model.path, "/etc/cleave/m.pt");
}

TEST(ConfigTest, EveryShippedExampleLoads) {
  int n = 0;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(CLEAVE_SOURCE_DIR) + "/deploy/examples")) {
    if (e.path().extension() != ".yaml") continue;
    auto c = LoadJob(e.path().string());
    EXPECT_TRUE(c.ok()) << c.status();
    ++n;
  }
  EXPECT_GE(n, 9);
}

// Each name table (core/names.h) against the docs row of its key: every name is
// documented there, in backquotes.
TEST(ConfigTest, TheReferenceNamesEveryChoice) {
  std::ifstream in(std::string(CLEAVE_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(in) << "docs/configuration.md";
  const std::string docs((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const NameTable& table : {StrategyNames(), RuleNames(), OptimizerNames(), LossNames(),
                                 ScheduleNames(), SplitModeNames(), AttackNames(),
                                 LoraTargetNames(), SelectionNames(), SchedulerModeNames(),
                                 TopologyNames(), StalenessNames(), DpNoiseNames(),
                                 WeightingNames()}) {
    const NameTable* t = &table;
    const size_t at = docs.find("| `" + t->key + "` |");
    ASSERT_NE(at, std::string::npos) << t->key;
    const std::string row = docs.substr(at, docs.find('\n', at) - at);
    EXPECT_GE(t->names.size(), 2u) << t->key;
    for (const std::string& n : t->names) {
      EXPECT_NE(row.find("`" + n + "`"), std::string::npos) << t->key << ": " << n << " is not documented";
    }
    // And the config refuses what is not in the table, naming the table.
    const Status s = t->Check("bogus-name");
    EXPECT_NE(s.message().find(t->key + ": unknown 'bogus-name'; choose one of " + t->names[0]), std::string::npos) << s;
  }
}

// docs/configuration.md has a row for every key Parse accepts (a profile's keys are
// described in the local.profiles row), and Parse accepts every key documented there.
TEST(ConfigTest, TheReferenceDocumentsEveryKey) {
  std::ifstream in(std::string(CLEAVE_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(in) << "docs/configuration.md";
  const std::string docs((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t profiles = docs.find("| `local.profiles` |");
  ASSERT_NE(profiles, std::string::npos);
  const std::string profiles_row = docs.substr(profiles, docs.find('\n', profiles) - profiles);
  std::vector<std::string> keys;
  for (const ConfigSection::Key& k : JobKeys()) keys.push_back(k.name);
  EXPECT_GT(keys.size(), 80u);
  for (const std::string& key : keys) {
    const std::string prefix = "local.profiles[].";
    if (key.rfind(prefix, 0) == 0) {
      EXPECT_NE(profiles_row.find("`" + key.substr(prefix.size()) + "`"), std::string::npos) << key;
    } else {
      EXPECT_NE(docs.find("| `" + key + "` |"), std::string::npos) << key << " is not documented";
    }
  }
  // The other way: a documented row names a key that exists.
  for (size_t at = docs.find("\n| `"); at != std::string::npos; at = docs.find("\n| `", at + 1)) {
    const size_t begin = at + 4, end = docs.find('`', begin);
    const std::string name = docs.substr(begin, end - begin);
    const bool dotted = name.find('.') != std::string::npos && name.find(' ') == std::string::npos &&
                        name.find(':') == std::string::npos;
    if (!dotted || name.rfind("test_", 0) == 0) continue;  // not a key row
    EXPECT_NE(std::find(keys.begin(), keys.end(), name), keys.end())
        << name << " is documented but not a key";
  }
}

// Each documented default is the options struct's: a row whose default cell is one
// `literal` names the value a job gets without the key (numbers compared as numbers);
// a row whose cell is "—" is a key with no value by default (an empty string or list).
// Prose cells ("all four", "the strategy's") are for a reader and are not compared.
TEST(ConfigTest, TheReferenceStatesEachKeysDefault) {
  std::ifstream in(std::string(CLEAVE_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(in) << "docs/configuration.md";
  const std::string docs((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  int compared = 0;
  for (const ConfigSection::Key& k : JobKeys()) {
    if (k.section) continue;
    const size_t at = docs.find("| `" + k.name + "` | ");
    if (at == std::string::npos) continue;  // a profile's key (TheReferenceDocumentsEveryKey)
    const size_t begin = at + k.name.size() + 7;
    const std::string cell = docs.substr(begin, docs.find(" |", begin) - begin);
    if (cell == "—") {
      EXPECT_TRUE(k.value.empty() || k.value == "[]") << k.name << " defaults to " << k.value;
      ++compared;
      continue;
    }
    if (cell.size() < 2 || cell.front() != '`' || cell.back() != '`' ||
        std::count(cell.begin(), cell.end(), '`') != 2) {
      continue;
    }
    std::string doc = cell.substr(1, cell.size() - 2);
    if (doc == "\"\"") doc.clear();
    char* end = nullptr;
    const double doc_number = std::strtod(doc.c_str(), &end);
    const bool number = !doc.empty() && *end == '\0';
    if (number) {
      const double value = std::strtod(k.value.c_str(), nullptr);
      EXPECT_NEAR(value, doc_number, 1e-9 * std::max(1.0, std::fabs(doc_number)))
          << k.name << ": the docs say " << doc << ", the struct " << k.value;
    } else {
      EXPECT_EQ(k.value, doc) << k.name;
    }
    ++compared;
  }
  EXPECT_GT(compared, 80);
}

}  // namespace
}  // namespace cleave
