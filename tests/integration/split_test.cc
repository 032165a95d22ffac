// Split learning end to end: a server and clients in one process over real gRPC.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <tuple>

#include "core/files.h"
#include "client/split_client.h"
#include "models/hf_folder.h"
#include "models/model.h"
#include "models/part.h"
#include "tests/integration/federation.h"

namespace cleave {
namespace {

constexpr char kSplitBase[] = R"(
data: {test_limit: 1000}
server: {heartbeat_s: 0.5, client_timeout_s: 30}
)";

const std::vector<std::string> kSplitModes = {"sl", "sfl-v1", "sfl-v2", "ushaped"};

struct Exactness {
  std::string mode;
  int cut;
};

class SplitExactnessTest : public ::testing::TestWithParam<Exactness> {};

// One split step (one client, one batch) gives the parameters one step of the uncut
// model gives on the same batch.
TEST_P(SplitExactnessTest, OneStepEqualsTheUncutModel) {
  const auto [mode, cut] = GetParam();
  auto data = ClientData(1, 32)[0];
  ASSERT_EQ(data.size, 32);
  LocalTrainOptions t;
  t.local_epochs = 1;
  t.batch_size = 32;
  t.lr = 0.1;
  t.momentum = 0.9;
  t.weight_decay = 1e-3;
  const UncutStep reference = TrainUncut({"lenet5", "", 7}, data, t);
  ASSERT_GT(reference.after.size(), 0u);
  const ParameterSet& before = reference.before;
  const ParameterSet& expected = reference.after;

  Federation f;
  std::vector<ClientOptions> opts(1);
  opts[0].train = data;
  f.Start(std::string(kSplitBase) + "model: {name: lenet5}\nrun: {rounds: 1, seed: 7}\n" +
              "clients: {min: 1}\n" +
              "train: {local_epochs: 1, batch_size: 32, lr: 0.1, momentum: 0.9, "
              "weight_decay: 0.001}\n" +
              "split: {mode: " + mode + ", cut: " + std::to_string(cut) + "}\n",
          std::move(opts));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  const ParameterSet got = f.server->GlobalModel();
  EXPECT_GT(MaxDiff(before, got), 1e-3) << "the step changed nothing";
  EXPECT_LT(MaxDiff(expected, got), 1e-5);
  auto h = f.server->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].split.value().cuts.at("client-0"), cut);
}

// The same with AdamW, weight decay, label smoothing and local_steps (two full-batch
// steps): each side of the cut keeps its own AdamW state, and together they step as the
// uncut model does.
TEST(SplitOptimizerTest, AdamWStepsEqualTheUncutModelInEveryMode) {
  auto data = ClientData(1, 32)[0];
  LocalTrainOptions t;
  t.local_steps = 2;
  t.batch_size = 32;
  t.optimizer = "adamw";
  t.lr = 0.003;
  t.weight_decay = 0.01;
  t.label_smoothing = 0.1;
  const UncutStep reference = TrainUncut({"lenet5", "", 7}, data, t);
  ASSERT_GT(reference.after.size(), 0u);
  const ParameterSet& before = reference.before;
  const ParameterSet& expected = reference.after;
  for (const std::string& mode : kSplitModes) {
    Federation f;
    std::vector<ClientOptions> opts(1);
    opts[0].train = data;
    f.Start(std::string(kSplitBase) + "model: {name: lenet5}\nrun: {rounds: 1, seed: 7}\n" +
                "clients: {min: 1}\n" +
                "train: {local_steps: 2, batch_size: 32, optimizer: adamw, lr: 0.003, "
                "weight_decay: 0.01, label_smoothing: 0.1}\n" +
                "split: {mode: " + mode + ", cut: 2}\n",
            std::move(opts));
    f.Join();
    ASSERT_TRUE(f.server_status.ok()) << mode << ": " << f.server_status;
    const ParameterSet got = f.server->GlobalModel();
    EXPECT_GT(MaxDiff(before, got), 1e-3) << mode << ": the steps changed nothing";
    EXPECT_LT(MaxDiff(expected, got), 1e-5) << mode;
  }
}

// A split round's mean model reaches the strategy as one update, so the server rule
// applies: with fedavg at server_lr 0.5 the model moves half of one uncut step, and in
// every mode FedAdam's first step is eta (1 - b1) D / (sqrt(b2 tau^2 + (1 - b2) D^2) + tau)
// for the uncut step's change D.
TEST(SplitStrategyTest, TheServerRuleAppliesToTheSplitRoundsMean) {
  auto data = ClientData(1, 32)[0];
  LocalTrainOptions t;
  t.local_epochs = 1;
  t.batch_size = 32;
  t.lr = 0.1;
  const UncutStep reference = TrainUncut({"lenet5", "", 7}, data, t);
  ASSERT_GT(reference.after.size(), 0u);
  const ParameterSet& before = reference.before;
  const ParameterSet& step = reference.after;
  const float eta = 0.1f, b1 = 0.9f, b2 = 0.99f, tau = 0.001f;
  ParameterSet half = before, adam = before;
  for (size_t i = 0; i < before.size(); ++i) {
    for (size_t j = 0; j < before.tensors()[i].values.size(); ++j) {
      const float x = before.tensors()[i].values[j];
      const float d = step.tensors()[i].values[j] - x;
      half.mutable_tensors()[i].values[j] = x + 0.5f * d;
      const float v = b2 * tau * tau + (1 - b2) * d * d;
      adam.mutable_tensors()[i].values[j] = x + eta * (1 - b1) * d / (std::sqrt(v) + tau);
    }
  }
  std::vector<std::tuple<std::string, std::string, const ParameterSet*>> runs = {
      {"sl", "{name: fedavg, server_lr: 0.5}", &half}};
  for (const std::string& mode : kSplitModes) runs.emplace_back(mode, "{name: fedadam}", &adam);
  for (const auto& [mode, strategy, expected] : runs) {
    Federation f;
    std::vector<ClientOptions> opts(1);
    opts[0].train = data;
    f.Start(std::string(kSplitBase) + "model: {name: lenet5}\nrun: {rounds: 1, seed: 7}\n" +
                "clients: {min: 1}\ntrain: {local_epochs: 1, batch_size: 32, lr: 0.1}\n" +
                "strategy: " + strategy + "\nsplit: {mode: " + mode + ", cut: 2}\n",
            std::move(opts));
    f.Join();
    ASSERT_TRUE(f.server_status.ok()) << mode << " " << strategy << ": " << f.server_status;
    const ParameterSet got = f.server->GlobalModel();
    EXPECT_GT(MaxDiff(before, got), 1e-4) << mode << " " << strategy;
    EXPECT_LT(MaxDiff(*expected, got), 2e-5) << mode << " " << strategy;
  }
}

std::vector<Exactness> AllModesAndCuts() {
  std::vector<Exactness> out;
  for (const char* mode : {"sl", "sfl-v1", "sfl-v2"}) {
    for (int cut = 1; cut <= 4; ++cut) out.push_back({mode, cut});
  }
  for (int cut = 1; cut <= 3; ++cut) out.push_back({"ushaped", cut});  // tail: stage 4
  return out;
}

// "sfl-v1" is not a test name; "sfl_v1" is.
std::string TestName(std::string s) {
  for (char& c : s) {
    if (c == '-') c = '_';
  }
  return s;
}

std::string ModeName(const ::testing::TestParamInfo<std::string>& i) { return TestName(i.param); }

INSTANTIATE_TEST_SUITE_P(Modes, SplitExactnessTest, ::testing::ValuesIn(AllModesAndCuts()),
                         [](const ::testing::TestParamInfo<Exactness>& i) {
                           return TestName(i.param.mode + "_cut" + std::to_string(i.param.cut));
                         });

}  // namespace
}  // namespace cleave

namespace cleave {
namespace {

class SplitModeTest : public ::testing::TestWithParam<std::string> {};

// Every mode learns: accuracy rises over two rounds, and what crossed the cut is counted.
TEST_P(SplitModeTest, ThreeClientsTwoRoundsAccuracyRises) {
  const std::string mode = GetParam();
  auto init = Model::Create({"lenet5", "", 3});
  ASSERT_TRUE(init.ok());
  Dataset test = *LoadFashionMnist(kFmnist, false, 1000);
  const double initial = (*init)->Evaluate(test, 1000)->accuracy;

  Federation f;
  f.Start(std::string(kSplitBase) + "model: {name: lenet5}\nrun: {rounds: 2, seed: 3}\n" +
              "clients: {min: 3, quorum: 1.0}\n" +
              "train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.5}\n" +
              "split: {mode: " + mode + ", cut: auto, window: 2}\n",
          Options(3, 6000));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
  auto h = f.server->History();
  ASSERT_EQ(h.size(), 2u);
  for (const auto& m : h) {
    EXPECT_EQ(m.participants, 3);
    EXPECT_TRUE(m.split.has_value());
    EXPECT_EQ(m.split.value().cuts.size(), 3u);
    EXPECT_GT(m.split.value().activation_bytes_up, 0);
    EXPECT_GT(m.split.value().gradient_bytes_down, 0);
    EXPECT_GT(m.split.value().step_s, 0);
    EXPECT_EQ(m.split.value().labels_up, mode == "ushaped" ? 0 : 6000) << "labels of one epoch";
  }
  // Shared server parts see the clients' batches in arrival order, so runs differ (a
  // U-shaped first round under load has reached as little as 0.28 from 0.09): both
  // rounds must be above the initial model, the second far above, and training goes on.
  EXPECT_GT(h[0].test_accuracy, initial + 0.1) << "initial " << initial;
  EXPECT_GT(h[1].test_accuracy, initial + 0.3) << "initial " << initial;
  EXPECT_LT(h[1].train_loss, h[0].train_loss);
}

INSTANTIATE_TEST_SUITE_P(Modes, SplitModeTest, ::testing::ValuesIn(kSplitModes), ModeName);

}  // namespace
}  // namespace cleave

namespace cleave {
namespace {

// A client that drops its connection in the middle of its split task fails only that
// task: the others finish, and the round commits without it.
TEST(SplitFailureTest, AClientThatDisconnectsMidStepFailsOnlyItsTask) {
  auto opts = Options(3, 1500);
  opts[1].crash_after_split_step = [](int64_t round, int64_t step) { return step == 5; };
  Federation f;
  f.Start(std::string(kSplitBase) + "model: {name: lenet5}\nrun: {rounds: 1, seed: 4}\n" +
              "clients: {min: 3, quorum: 0.5}\n" +
              "train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.5}\n" +
              "split: {mode: sfl-v2, cut: 2, window: 2}\n",
          std::move(opts));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  EXPECT_TRUE(f.client_status[0].ok()) << f.client_status[0];
  EXPECT_EQ(f.client_status[1].code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(f.client_status[2].ok()) << f.client_status[2];
  auto h = f.server->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].participants, 2);
  EXPECT_EQ(h[0].failures, 1);
  EXPECT_LT(h[0].wall_s, 20) << "the failure was noticed, not waited out";
  EXPECT_EQ(f.clients[0]->tasks_completed(), 1);
  EXPECT_EQ(f.clients[2]->tasks_completed(), 1);
}

}  // namespace
}  // namespace cleave

namespace cleave {
namespace {

// int8 activations and gradients: about a quarter of the bytes across the cut, and the
// federation learns as well. sfl-v1, whose runs repeat themselves (each client has its own
// server copy), so that the two runs differ by the codec alone.
// The client parts also travel down and back up as int8.
TEST(SplitCompressionTest, Int8ActivationsAndGradientsLearnInAQuarterOfTheBytes) {
  auto run = [](const std::string& codec) {
    return RunToEnd(std::string(kSplitBase) + "model: {name: lenet5}\nrun: {rounds: 2, seed: 3}\n" +
                        "clients: {min: 3, quorum: 1.0}\n" +
                        "train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.5}\n" +
                        "split: {mode: sfl-v1, cut: 2}\n" + "compression: {activations: " +
                        codec + ", gradients: " + codec + ", update: " + codec +
                        ", broadcast: " + codec + "}\n",
                    Options(3, 3000));
  };
  const auto fp32 = run("none");
  const auto int8 = run("int8");
  ASSERT_EQ(fp32.size(), 2u);
  ASSERT_EQ(int8.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(int8[r].participants, 3);
    // Labels (8 bytes a sample) are not compressed: 256 x 4 + 8 vs 256 + 8 bytes a sample.
    EXPECT_GE(static_cast<double>(fp32[r].split.value().activation_bytes_up) / int8[r].split.value().activation_bytes_up, 3.5);
    EXPECT_GE(static_cast<double>(fp32[r].split.value().gradient_bytes_down) / int8[r].split.value().gradient_bytes_down, 3.9);
  }
  EXPECT_GT(int8[1].test_accuracy, 0.5);
  EXPECT_NEAR(int8[1].test_accuracy, fp32[1].test_accuracy, 0.1);
}

}  // namespace
}  // namespace cleave

namespace cleave {
namespace {

class SplitTextTest : public ::testing::TestWithParam<std::string> {};

// A random tiny Hugging Face folder at TempDir()/NAME, written afresh by the reference
// script (tests/models/llama_reference.py make NAME KIND DTYPE SHARDS SEED); its path.
std::string MakeHfFolder(const std::string& name, const std::string& kind, const std::string& dtype, int shards,
                         int seed) {
  const std::string dir = ::testing::TempDir() + name;
  std::filesystem::remove_all(dir);
  EXPECT_EQ(std::system((std::string("/usr/bin/python3 ") + CLEAVE_SOURCE_DIR + "/tests/models/llama_reference.py make " +
                         dir + " " + kind + " " + dtype + " " + std::to_string(shards) + " " + std::to_string(seed))
                            .c_str()),
            0);
  return dir;
}

// LoRA across a run from `start` to `end`: every frozen tensor ends as it started (a
// failure names it); returns how many adapter tensors changed.
int TrainedAdapters(const ParameterSet& start, const ParameterSet& end) {
  int changed = 0;
  for (const Tensor& t : start.tensors()) {
    const bool adapter = t.name.find(".lora_") != std::string::npos;
    const bool same = end.Find(t.name)->values == t.values;
    if (!adapter) {
      EXPECT_TRUE(same) << t.name << " is frozen";
    }
    changed += adapter && !same;
  }
  return changed;
}

// The decoder cut between device and server learns English in every mode: fortunes
// categories as clients, token labels crossing the cut except in U-shaped learning,
// where the device keeps the head and the next tokens never leave it.
TEST_P(SplitTextTest, TheDecoderLearnsAcrossTheCut) {
  const std::string mode = GetParam();
  Federation f;
  f.Start("server: {heartbeat_s: 0.5, client_timeout_s: 30}\n"
          "model: {name: gpt, gpt: {vocab: 256, context: 32, layers: 2, heads: 4, dim: 64}}\n"
              "data: {test: \"text:/usr/share/games/fortunes,context=32\", test_limit: 256}\n"
              "run: {rounds: 2, seed: 3}\nclients: {min: 3, quorum: 1.0}\n"
              "train: {optimizer: adamw, lr: 0.003, local_steps: 25, batch_size: 16}\n"
              "split: {mode: " + mode + ", cut: auto, window: 2}\n",
          NaturalClients("text:/usr/share/games/fortunes,context=32", 3));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
  auto h = f.server->History();
  ASSERT_EQ(h.size(), 2u);
  for (const auto& m : h) {
    EXPECT_EQ(m.participants, 3);
    EXPECT_EQ(m.split.value().labels_up, mode == "ushaped" ? 0 : 3 * 25 * 16 * 32) << "a label per token";
    EXPECT_GT(m.split.value().server_busy, 0);
    if (mode != "sfl-v1") {
      EXPECT_LE(m.split.value().server_busy, 1.0) << "one shared part computes at a time";
    }
  }
  EXPECT_LT(h[0].test_metrics.at("perplexity"), 100);  // from about 256
  // Round 2 starts from round 1's parts: it keeps what was learnt. It usually gains
  // (33.9 -> 32.3 in sfl-v1, whose runs repeat), but in sfl-v2 and U-shaped learning the
  // clients' steps on the shared server part interleave by thread timing, which at this
  // early plateau can tip a round into a worse regime (32.5 after 31.1 seen here; in
  // PerTokenInt8's two-client version, 37 where 29 was usual). A model that lost its
  // parts between rounds would be back near 100 or above: three times round 1's.
  EXPECT_LT(h[1].test_metrics.at("perplexity"), 1.5 * h[0].test_metrics.at("perplexity"));
}

INSTANTIATE_TEST_SUITE_P(Modes, SplitTextTest, ::testing::ValuesIn(kSplitModes), ModeName);

// LoRA in split learning: the client's adapters are averaged, the server's are shared
// (sfl-v2, U-shaped) or per client (sfl-v1); every adapter trains and every frozen
// tensor ends the run as it started, on both sides of the cut.
TEST(SplitTextTest, LoraAdaptersTrainOnBothSidesOfTheCut) {
  for (const std::string mode : {"sfl-v1", "sfl-v2", "ushaped"}) {
    SCOPED_TRACE(mode);
    Federation f;
    f.Start("server: {heartbeat_s: 0.5, client_timeout_s: 30}\n"
            "model: {name: gpt, gpt: {vocab: 256, context: 32, layers: 2, heads: 4, dim: 64},"
            " lora: {rank: 4, alpha: 8}}\n"
            "data: {test: \"text:/usr/share/games/fortunes,context=32\", test_limit: 128}\n"
            "run: {rounds: 1, seed: 3}\nclients: {min: 2, quorum: 1.0}\n"
            "train: {optimizer: adamw, lr: 0.01, local_steps: 15, batch_size: 16}\n"
            "split: {mode: " + mode + ", cut: 2, window: 2, tail: 1}\n",
            NaturalClients("text:/usr/share/games/fortunes,context=32", 2));
    const ParameterSet start = f.server->GlobalModel();
    f.Join();
    ASSERT_TRUE(f.server_status.ok()) << f.server_status;
    const ParameterSet end = f.server->GlobalModel();
    EXPECT_EQ(TrainedAdapters(start, end), 2 * 4 * 2) << "A and B of the 4 projections of both blocks trained";
    // Only the client's adapters travel up: what went up besides the split streams is
    // two uploads of one block's adapters (4 K values), not of the part (the embedding
    // and a block: 70 K values).
    const auto h = f.server->History();
    ASSERT_EQ(h.size(), 1u);
    EXPECT_LT(h[0].bytes_up - h[0].split.value().activation_bytes_up, 2 * 40000);
    // Down, besides the split streams: each client's frozen tensors once, those of its
    // own stages (embedding and first block; U-shaped also the head), not the model's.
    int64_t frozen_bytes = 0;
    for (const Tensor& t : start.tensors()) {
      if (t.name.find(".lora_") == std::string::npos) frozen_bytes += 4 * static_cast<int64_t>(t.values.size());
    }
    EXPECT_LT(h[0].bytes_down - h[0].split.value().gradient_bytes_down, 2 * frozen_bytes * 3 / 4);
  }
}

// A Llama-family decoder from a Hugging Face folder (model.name: hf; the folder written by
// tests/models/llama_reference.py, grouped-query attention over bytes) in the split modes
// as they are: cut automatically in sfl-v2 it learns English; with LoRA on its attention
// projections in U-shaped learning, its adapters train on both sides and every frozen
// tensor ends as it started.
TEST(SplitTextTest, AHuggingFaceLlamaTrainsAcrossTheCut) {
  const std::string dir = MakeHfFolder("cleave_split_hf_llama", "bytes", "F32", 2, 5);
  const std::string base = "server: {heartbeat_s: 0.5, client_timeout_s: 30}\n"
                           "data: {test: \"text:/usr/share/games/fortunes,context=32\", test_limit: 128}\n"
                           "run: {rounds: 1, seed: 3}\nclients: {min: 2, quorum: 1.0}\n";
  {
    Federation f;
    f.Start(base + "model: {name: hf, path: " + dir + ", gpt: {context: 32}}\n" +
                "train: {optimizer: adamw, lr: 0.003, local_steps: 25, batch_size: 16}\n"
                "split: {mode: sfl-v2, cut: auto, window: 2}\n",
            NaturalClients("text:/usr/share/games/fortunes,context=32", 2));
    f.Join();
    ASSERT_TRUE(f.server_status.ok()) << f.server_status;
    for (const auto& st : f.client_status) EXPECT_TRUE(st.ok()) << st;
    const auto h = f.server->History();
    ASSERT_EQ(h.size(), 1u);
    EXPECT_EQ(h[0].participants, 2);
    EXPECT_LT(h[0].test_metrics.at("perplexity"), 100);  // from about 256
  }
  Federation f;
  f.Start(base + "model: {name: hf, path: " + dir + ", gpt: {context: 32}, lora: {rank: 4, alpha: 8, targets: [q_proj, v_proj]}}\n" +
              "train: {optimizer: adamw, lr: 0.01, local_steps: 10, batch_size: 16}\n"
              "split: {mode: ushaped, cut: 2, tail: 1, window: 2}\n",
          NaturalClients("text:/usr/share/games/fortunes,context=32", 2));
  const ParameterSet start = f.server->GlobalModel();
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  const ParameterSet end = f.server->GlobalModel();
  EXPECT_EQ(TrainedAdapters(start, end), 2 * 2 * 2) << "A and B of q_proj and v_proj in both blocks trained";
  std::filesystem::remove_all(dir);
}

// The same Hugging Face folder as width-scaled submodels (width.method fedrolex): devices
// at widths 1 and 1/2 (one of its two key/value heads with its query heads, half its MLP
// features) train the folder's model federated, and it learns English.
TEST(HfWidthTest, AHuggingFaceLlamaTrainsAsWidthScaledSubmodels) {
  const std::string dir = MakeHfFolder("cleave_width_hf_llama", "bytes", "F32", 1, 5);
  Federation f;
  f.Start("server: {heartbeat_s: 0.5, client_timeout_s: 30}\n"
          "data: {test: \"text:/usr/share/games/fortunes,context=32\", test_limit: 128}\n"
          "run: {rounds: 2, seed: 3}\nclients: {min: 2, quorum: 1.0}\n"
          "model: {name: hf, path: " + dir + ", gpt: {context: 32}}\n"
          "train: {optimizer: adamw, lr: 0.003, local_steps: 20, batch_size: 16}\n"
          "width: {method: fedrolex, clients: [{name: client-1, rate: 0.5}]}\n",
          NaturalClients("text:/usr/share/games/fortunes,context=32", 2));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& st : f.client_status) EXPECT_TRUE(st.ok()) << st;
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[1].widths, (std::map<std::string, double>{{"client-0", 1.0}, {"client-1", 0.5}}));
  EXPECT_LT(h[1].test_metrics.at("perplexity"), h[0].test_metrics.at("perplexity"));
  EXPECT_LT(h[1].test_metrics.at("perplexity"), 100);  // from about 256
  std::filesystem::remove_all(dir);
}

// QLoRA across the cut: a model with a tied head (the embedding on the device, the head
// on the server, both frozen) whose blocks are held in NF4 by the devices and the server,
// with activation checkpointing; the adapters on both sides train and the model learns.
// The same base in a federated round, where each client loads the whole quantized set.
TEST(SplitTextTest, AQuantizedTiedLlamaTrainsAcrossTheCutAndFederated) {
  const std::string dir = MakeHfFolder("cleave_split_hf_qlora", "bytes-tied", "F32", 1, 5);
  const std::string base = "server: {heartbeat_s: 0.5, client_timeout_s: 30}\n"
                           "data: {test: \"text:/usr/share/games/fortunes,context=32\", test_limit: 128}\n"
                           "run: {rounds: 1, seed: 3}\nclients: {min: 2, quorum: 1.0}\n"
                           "model: {name: hf, path: " + dir + ", gpt: {context: 32}, quantize: nf4, "
                           "lora: {rank: 4, alpha: 8}}\n"
                           "train: {optimizer: adamw, lr: 0.01, local_steps: 15, batch_size: 16, recompute: true}\n";
  for (const std::string mode : {"split: {mode: sfl-v2, cut: auto, window: 2}\n", ""}) {
    SCOPED_TRACE(mode.empty() ? "federated" : mode);
    Federation f;
    f.Start(base + mode, NaturalClients("text:/usr/share/games/fortunes,context=32", 2));
    const ParameterSet start = f.server->GlobalModel();
    f.Join();
    ASSERT_TRUE(f.server_status.ok()) << f.server_status;
    for (const auto& st : f.client_status) EXPECT_TRUE(st.ok()) << st;
    EXPECT_EQ(start.Find("1.self_attn.q_proj.weight"), nullptr);  // held quantized, not a parameter
    EXPECT_EQ(TrainedAdapters(start, f.server->GlobalModel()), 2 * 7 * 2) << "A and B of every projection";
    const auto h = f.server->History();
    ASSERT_EQ(h.size(), 1u);
    EXPECT_LT(h[0].test_metrics.at("perplexity"), 230);  // from about 256
  }
  std::filesystem::remove_all(dir);
}

// A device with its own copy of the model's folder (--model-dir) reads its stages'
// frozen weights from it instead of downloading them: one client, so that both runs take
// the same steps, trains to exactly the model it trains to with the base downloaded, and
// at least the base's bytes fewer go down. A folder of other weights is refused, naming
// it, by the digest the server's base has.
// QLoRA over a pipeline: each device of the chain gets the quantized weights and the
// frozen base of its own segment only, and every block's adapters train (the device's and
// the server's) while the frozen tensors stay as they were.
TEST(SplitTextTest, AQuantizedLlamaTrainsAcrossAPipeline) {
  const std::string dir = MakeHfFolder("cleave_pipeline_hf_qlora", "bytes", "F32", 1, 6);
  auto clients = NaturalClients("text:/usr/share/games/fortunes,context=32", 2);
  clients[1].peer_listen = "127.0.0.1:0";
  Federation f;
  f.Start("server: {heartbeat_s: 0.5, client_timeout_s: 30}\n"
          "data: {test: \"text:/usr/share/games/fortunes,context=32\", test_limit: 128}\n"
          "run: {rounds: 1, seed: 3}\nclients: {min: 2, quorum: 1.0}\n"
          "model: {name: hf, path: " + dir + ", gpt: {context: 32}, quantize: nf4, lora: {rank: 4, alpha: 8}}\n"
          "train: {optimizer: adamw, lr: 0.01, local_steps: 10, batch_size: 16}\n"
          "split: {mode: pipeline, cut: 2, devices: 2, micro_batches: 2}\n",
          std::move(clients));
  const ParameterSet start = f.server->GlobalModel();
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& st : f.client_status) EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(start.Find("1.self_attn.q_proj.weight"), nullptr);  // held quantized, not a parameter
  int adapters = 0;
  for (const Tensor& t : start.tensors()) adapters += t.name.find(".lora_") != std::string::npos;
  EXPECT_GT(adapters, 0);
  EXPECT_EQ(TrainedAdapters(start, f.server->GlobalModel()), adapters) << "every block's, on the device and the server";
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].split.value().chains.at(0).bounds, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(h[0].split.value().chains.at(0).done);
  std::filesystem::remove_all(dir);
}

TEST(SplitTextTest, ADeviceReadsItsStagesFromItsOwnCopyOfTheFolder) {
  const std::string dir = MakeHfFolder("cleave_split_hf_local", "bytes-tied", "F32", 1, 5);
  const std::string other = MakeHfFolder("cleave_split_hf_local_other", "bytes-tied", "F32", 1, 6);
  const std::string data = "text:/usr/share/games/fortunes,context=32";
  const std::string yaml = "server: {heartbeat_s: 0.5, client_timeout_s: 30}\n"
                           "data: {test: \"" + data + "\", test_limit: 64}\n"
                           "run: {rounds: 1, seed: 3}\nclients: {min: 1, quorum: 1.0}\n"
                           "model: {name: hf, path: " + dir + ", gpt: {context: 32}, lora: {rank: 4, alpha: 8}}\n"
                           "train: {optimizer: adamw, lr: 0.01, local_steps: 6, batch_size: 8}\n"
                           "split: {mode: sfl-v2, cut: 2, window: 1}\n";
  std::vector<ParameterSet> trained;
  std::vector<int64_t> down;
  ParameterSet initial;
  for (const std::string& model_dir : {std::string(), dir}) {
    SCOPED_TRACE(model_dir.empty() ? "base downloaded" : "base read from the folder");
    std::vector<ClientOptions> clients = NaturalClients(data, 1);
    clients[0].model_dir = model_dir;
    Federation f;
    f.Start(yaml, std::move(clients));
    f.Join();
    ASSERT_TRUE(f.server_status.ok()) << f.server_status;
    EXPECT_TRUE(f.client_status[0].ok()) << f.client_status[0];
    const auto h = f.server->History();
    ASSERT_EQ(h.size(), 1u);
    EXPECT_EQ(h[0].participants, 1);
    trained.push_back(f.server->GlobalModel());
    down.push_back(h[0].bytes_down);
    initial = f.initial;
  }
  EXPECT_EQ(TrainedAdapters(initial, trained[1]), 2 * 7 * 2);
  for (const Tensor& t : trained[0].tensors()) EXPECT_EQ(trained[1].Find(t.name)->values, t.values) << t.name;
  ParameterSet base;  // the frozen tensors of the device's stages 0 and 1
  for (const Tensor& t : initial.tensors()) {
    const bool device = t.name.rfind("0.", 0) == 0 || t.name.rfind("1.", 0) == 0;
    if (device && t.name.find(".lora_") == std::string::npos) {
      ASSERT_TRUE(base.Add(t).ok());
    }
  }
  EXPECT_GE(down[0] - down[1], static_cast<int64_t>(base.EncodedSize())) << down[0] << " " << down[1];

  ModelSpec spec;
  spec.lora.rank = 4;
  spec.lora.alpha = 8;
  auto config = ReadHfConfig(dir);
  ASSERT_TRUE(config.ok());
  ASSERT_TRUE(SetHfModel(spec, *config, "config.json").ok());
  spec.gpt.context = 32;
  for (const std::string& folder : {dir, other}) {
    auto part = ModelPart::Create(spec, 0, 2);
    ASSERT_TRUE(part.ok()) << part.status();
    const ParameterSet own = (*part)->Parameters();
    ParameterSet adapters;
    for (const Tensor& t : own.tensors()) {
      if (t.name.find(".lora_") != std::string::npos) {
        ASSERT_TRUE(adapters.Add(t).ok());
      }
    }
    const Status s = LoadPartFromFolder(**part, adapters, folder, Sha256Hex(base.Encode()), nullptr);
    if (folder == dir) {
      EXPECT_TRUE(s.ok()) << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_NE(s.message().find("--model-dir " + other + " does not hold the server's model"), std::string::npos) << s;
    }
  }
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(other);
}

// The server reads a Hugging Face folder straight into its global model: exactly the
// folder's values (LoRA adapters keep their initial ones), and a folder without its
// weights is refused naming model.path and what is missing.
TEST(SplitTextTest, TheServerReadsTheFolderIntoItsGlobalModel) {
  const std::string dir = MakeHfFolder("cleave_server_hf", "bytes-tied", "BF16", 2, 5);
  auto server_of = [&] {
    ServerOptions o;
    o.config = TestConfig("model: {name: hf, path: " + dir + ", gpt: {context: 32}, lora: {rank: 4, alpha: 8}}\n"
                          "data: {test: \"text:/usr/share/games/fortunes,context=32\", test_limit: 8}\n");
    o.listen = "127.0.0.1:0";
    o.insecure = true;
    return Server::Create(std::move(o));
  };
  auto server = server_of();
  ASSERT_TRUE(server.ok()) << server.status();
  const ParameterSet global = (*server)->GlobalModel();
  auto weights = LoadHfWeights(dir, global, 2);
  ASSERT_TRUE(weights.ok()) << weights.status();
  int read = 0;
  for (const Tensor& t : weights->tensors()) {
    EXPECT_EQ(global.Find(t.name)->values, t.values) << t.name;
    read += t.name.find(".lora_") == std::string::npos;
  }
  EXPECT_GT(read, 10);
  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
  auto refused = server_of();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("model.path: cannot open " + dir + "/model-00002-of-00002.safetensors"),
            std::string::npos) << refused.status();
  std::filesystem::remove_all(dir);
}

// Instruction data across the cut: prompts are read but only responses are predicted, so
// labels of the prompts cross the cut as "no target" (kNoTarget), which the server takes
// and leaves out of the loss; the model learns the task (answer = the instruction's word,
// reversed) far below chance on the response tokens.
TEST(SplitTextTest, InstructionDataTrainsOnTheResponsesAcrossTheCut) {
  const std::string dir = ::testing::TempDir() + "cleave_split_instruct";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::mt19937 rng(4);
  for (const char* file : {"a.jsonl", "b.jsonl"}) {
    std::string lines;
    for (int i = 0; i < 100; ++i) {
      std::string word;
      for (int k = 0; k < 4; ++k) word += static_cast<char>('a' + rng() % 6);
      lines += "{\"instruction\": \"" + word + "\", \"output\": \"" + std::string(word.rbegin(), word.rend()) + "\"}\n";
    }
    ASSERT_TRUE(WriteFileAtomic(dir + "/" + file, lines).ok());
  }
  const std::string spec = "instruct:" + dir + ",context=160";
  Federation f;
  f.Start("server: {heartbeat_s: 0.5, client_timeout_s: 30}\n"
          "model: {name: gpt, gpt: {vocab: 256, context: 160, layers: 2, heads: 4, dim: 64}}\n"
          "data: {test: \"" + spec + "\", test_limit: 16}\n"
          "run: {rounds: 1, seed: 3}\nclients: {min: 2, quorum: 1.0}\n"
          "train: {optimizer: adamw, lr: 0.003, local_steps: 25, batch_size: 8}\n"
          "split: {mode: sfl-v2, cut: 2, window: 2}\n",
          NaturalClients(spec, 2));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& st : f.client_status) EXPECT_TRUE(st.ok()) << st;
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].test_metrics.at("tokens"), 16 * 4) << "only the four response bytes are predicted";
  EXPECT_LT(h[0].test_metrics.at("perplexity"), 8);  // of the six letters; 256 at the start
  std::filesystem::remove_all(dir);
}

// int8 per token row: each token's activation (and gradient) keeps its own scale, so
// about a quarter of the bytes cross the cut ([16, 32, 64] float32 micro-batches: 4 x 64
// bytes a token against 64 + 2) and the decoder learns about as well. One client, so that
// the server-side steps come in one order: with two, their interleaving (arrival order)
// decides between two regimes of this early plateau, and either codec's perplexity
// ranged from 29 to 37 (fp32) or 55 (int8) under load.
TEST(SplitTextTest, PerTokenInt8CrossesTheCutInAQuarterOfTheBytes) {
  auto run = [](const std::string& codec) {
    auto client = NaturalClients("text:/usr/share/games/fortunes,context=32", 2);
    client.resize(1);  // half the fortune files
    Federation f;
    f.Start("server: {heartbeat_s: 0.5, client_timeout_s: 30}\n"
            "model: {name: gpt, gpt: {vocab: 256, context: 32, layers: 2, heads: 4, dim: 64}}\n"
            "data: {test: \"text:/usr/share/games/fortunes,context=32\", test_limit: 128}\n"
            "run: {rounds: 1, seed: 3}\nclients: {min: 1, quorum: 1.0}\n"
            "train: {optimizer: adamw, lr: 0.003, local_steps: 20, batch_size: 16}\n"
            "split: {mode: sfl-v2, cut: 2, window: 2}\n"
            "compression: {activations: " + codec + ", gradients: " + codec + "}\n",
            std::move(client));
    f.Join();
    EXPECT_TRUE(f.server_status.ok()) << f.server_status;
    auto h = f.server->History();
    EXPECT_EQ(h.size(), 1u);
    return h.empty() ? RoundMetrics{} : h[0];
  };
  const auto fp32 = run("none"), int8 = run("int8:token");
  EXPECT_EQ(int8.participants, 1);
  EXPECT_GE(static_cast<double>(fp32.split.value().activation_bytes_up) / int8.split.value().activation_bytes_up, 3.7);
  EXPECT_GE(static_cast<double>(fp32.split.value().gradient_bytes_down) / int8.split.value().gradient_bytes_down, 3.7);
  // One client's steps are repeatable: only the codec differs (30.958 against 30.946).
  EXPECT_LT(int8.test_metrics.at("perplexity"), 1.02 * fp32.test_metrics.at("perplexity"));
}

// A device the cut policy cannot profile (its data does not fit the model) would never
// get a task: it says why and exits, rather than sitting connected; the run goes on.
TEST(SplitAutoCutTest, ADeviceThatCannotBeProfiledExitsWithTheReason) {
  std::vector<ClientOptions> clients = Options(1, 600);
  ClientOptions text;
  text.train = *LoadDataSpec("text:/usr/share/games/fortunes/wisdom,context=16", true);
  clients.push_back(std::move(text));
  Federation f;
  f.Start(std::string(kSplitBase) + "model: {name: lenet5}\nrun: {rounds: 1, seed: 3}\n" +
              "clients: {min: 1, quorum: 1.0}\n" +
              "train: {local_epochs: 1, batch_size: 32, lr: 0.05}\n" +
              "split: {mode: sfl-v2, cut: auto}\n",
          std::move(clients));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  EXPECT_TRUE(f.client_status[0].ok()) << f.client_status[0];
  EXPECT_EQ(f.client_status[1].code(), absl::StatusCode::kInvalidArgument) << f.client_status[1];
  EXPECT_NE(f.client_status[1].message().find("cannot profile this device"), std::string::npos)
      << f.client_status[1];
  EXPECT_EQ(f.server->History().size(), 1u);
}

// Tensors over gRPC's 4 MiB message limit (640 sequences of 64 tokens of width 32:
// 5.2 MB a micro-batch) cross the cut in chunks: U-shaped learning sends all four kinds
// (activations up, the middle's output down, its gradient up, the cut's gradient down).
TEST(SplitLargeTensorsTest, MicroBatchesOverOneMessageTravelInChunks) {
  for (const std::string mode : {"ushaped"}) {
    Federation f;
    f.Start("server: {heartbeat_s: 0.5, client_timeout_s: 30}\n"
            "model: {name: gpt, gpt: {vocab: 256, context: 64, layers: 2, heads: 2, dim: 32}}\n"
            "data: {test: \"text:/usr/share/games/fortunes/wisdom,context=64\", test_limit: 8}\n"
            "run: {rounds: 1, seed: 3}\nclients: {min: 1, quorum: 1.0}\n"
            "train: {optimizer: adamw, lr: 0.003, local_steps: 1, batch_size: 640}\n"
            "split: {mode: " + mode + ", cut: 1, window: 1, tail: 1}\n",
            NaturalClients("text:/usr/share/games/fortunes/wisdom,context=64", 1));
    f.Join();
    ASSERT_TRUE(f.server_status.ok()) << f.server_status;
    for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
    const auto h = f.server->History();
    ASSERT_EQ(h.size(), 1u);
    EXPECT_EQ(h[0].participants, 1);
    EXPECT_GT(h[0].split.value().activation_bytes_up, int64_t{4} << 20) << "one micro-batch of 5.2 MB";
    EXPECT_GT(h[0].split.value().gradient_bytes_down, int64_t{4} << 20);
  }
}

}  // namespace
}  // namespace cleave
