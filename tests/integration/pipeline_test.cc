// split.mode: pipeline end to end: chains of real clients over real gRPC, each device
// past the data owner serving Peer on a port of its own.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include <unistd.h>

#include "core/files.h"
#include "tests/integration/federation.h"

namespace cleave {
namespace {

constexpr char kBase[] = R"(
data: {test_limit: 1000}
server: {heartbeat_s: 0.5, client_timeout_s: 30}
)";

struct Chain {
  int devices;
  int micro_batches;
  std::string schedule;
  bool ushaped = false;  // the owner keeps the last stage and the labels; the server [3, 4)
};

class PipelineExactnessTest : public ::testing::TestWithParam<Chain> {};

// Joins a one-round federation whose step must be the uncut model's from `before` to
// `expected` (to 1e-5).
void ExpectTheUncutStep(Federation& f, const ParameterSet& before, const ParameterSet& expected) {
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
  const ParameterSet got = f.server->GlobalModel();
  EXPECT_GT(MaxDiff(before, got), 1e-3) << "the step changed nothing";
  EXPECT_LT(MaxDiff(expected, got), 1e-5);
}

// One batch through a chain of K devices and the server, as M micro-batches in either
// schedule, steps every holder as one step of the uncut model on the whole batch does;
// U-shaped too, the head's input passing back down the chain to the data owner.
TEST_P(PipelineExactnessTest, OneBatchEqualsTheUncutModelsStep) {
  const auto [k, m, schedule, ushaped] = GetParam();
  const int cut = ushaped ? 3 : 4;
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

  // client-0 owns the data (it serves no Peer); the others relay.
  std::vector<ClientOptions> opts(k);
  for (int i = 0; i < k; ++i) {
    opts[i].train = data;
    if (i > 0) opts[i].peer_listen = "127.0.0.1:0";
  }
  Federation f;
  f.Start(std::string(kBase) + "model: {name: lenet5}\nrun: {rounds: 1, seed: 7}\n" +
              "clients: {min: " + std::to_string(k) + "}\n" +
              "train: {local_epochs: 1, batch_size: 32, lr: 0.1, momentum: 0.9, weight_decay: 0.001}\n" +
              "split: {mode: pipeline, cut: " + std::to_string(cut) + ", devices: " + std::to_string(k) +
              ", micro_batches: " + std::to_string(m) + ", schedule: " + schedule +
              (ushaped ? ", ushaped: true" : "") + "}\n",
          std::move(opts));
  ExpectTheUncutStep(f, before, expected);
  if (HasFatalFailure()) return;
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].participants, k);
  const auto& chains = h[0].split.value().chains;
  ASSERT_EQ(chains.size(), 1u);
  EXPECT_TRUE(chains[0].done);
  ASSERT_EQ(chains[0].devices.size(), static_cast<size_t>(k));
  EXPECT_EQ(chains[0].devices[0], "client-0");
  EXPECT_EQ(chains[0].bounds.front(), 0);
  EXPECT_EQ(chains[0].bounds.back(), cut);
  // U-shaped, no label reaches the server.
  EXPECT_EQ(h[0].split.value().labels_up > 0, !ushaped);
  // Every device's passes over the batch are on the timeline: M forward and M backward.
  std::vector<int> passes(k, 0);
  for (const auto& s : chains[0].spans) {
    ++passes.at(s.device);
    EXPECT_GE(s.end_s, s.start_s);
  }
  for (int i = 0; i < k; ++i) EXPECT_EQ(passes[i], 2 * m) << "device " << i;
}

INSTANTIATE_TEST_SUITE_P(Chains, PipelineExactnessTest,
                         ::testing::Values(Chain{1, 4, "1f1b"}, Chain{2, 2, "gpipe"}, Chain{3, 4, "1f1b"},
                                           Chain{3, 8, "gpipe"}, Chain{4, 1, "1f1b"}, Chain{4, 4, "1f1b"},
                                           Chain{1, 4, "1f1b", true}, Chain{2, 2, "gpipe", true},
                                           Chain{3, 4, "1f1b", true}),
                         [](const ::testing::TestParamInfo<Chain>& i) {
                           return "k" + std::to_string(i.param.devices) + "_m" + std::to_string(i.param.micro_batches) +
                                  "_" + i.param.schedule + (i.param.ushaped ? "_ushaped" : "");
                         });

// Variable-length text by a token budget (split.micro_batch_tokens): instruction data
// whose responses differ in length, each micro-batch cut after its longest sequence's
// last target and weighted by its share of the batch's targets, steps every holder as
// one step of the uncut model on the whole batch does (whose loss is the mean over all
// of the batch's targets); U-shaped too.
class TokenBudgetExactnessTest : public ::testing::TestWithParam<bool> {};

TEST_P(TokenBudgetExactnessTest, OneBatchEqualsTheUncutModelsStep) {
  const bool ushaped = GetParam();
  const std::string dir = ::testing::TempDir() + "cleave_pipeline_tokens_" + (ushaped ? "u" : "line") + "_" +
                          std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::mt19937 rng(5);
  std::string lines;
  for (int i = 0; i < 32; ++i) {
    std::string word, answer;
    for (int k = 0, n = 1 + static_cast<int>(rng() % 30); k < n; ++k) word += static_cast<char>('a' + rng() % 26);
    for (int k = 0, n = 1 + static_cast<int>(rng() % 90); k < n; ++k) answer += static_cast<char>('a' + rng() % 26);
    lines += "{\"instruction\": \"" + word + "\", \"output\": \"" + answer + "\"}\n";
  }
  ASSERT_TRUE(WriteFileAtomic(dir + "/a.jsonl", lines).ok());
  auto data = LoadDataSpec("instruct:" + dir + "/a.jsonl,context=256,test=0", true);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->size, 32);
  ModelSpec spec{"gpt", "", 7};
  spec.gpt = {256, 256, 3, 2, 32, false};
  LocalTrainOptions t;
  t.local_epochs = 1;
  t.batch_size = 32;
  t.lr = 0.1;
  t.momentum = 0.9;
  const UncutStep reference = TrainUncut(spec, *data, t);
  ASSERT_GT(reference.after.size(), 0u);
  const ParameterSet& before = reference.before;
  const ParameterSet& expected = reference.after;

  std::vector<ClientOptions> opts(2);
  opts[0].train = *data;
  opts[1].train = *data;
  opts[1].peer_listen = "127.0.0.1:0";
  Federation f;
  f.Start(std::string("server: {heartbeat_s: 0.5, client_timeout_s: 30}\n") +
              "model: {name: gpt, gpt: {vocab: 256, context: 256, layers: 3, heads: 2, dim: 32}}\n" +
              "data: {test: \"instruct:" + dir + "/a.jsonl,context=256\", test_limit: 8}\n" +
              "run: {rounds: 1, seed: 7}\nclients: {min: 2}\n" +
              "train: {local_steps: 1, batch_size: 32, lr: 0.1, momentum: 0.9}\n" +
              "split: {mode: pipeline, cut: " + (ushaped ? "2" : "3") +
              ", devices: 2, micro_batches: 4, micro_batch_tokens: 1024, schedule: 1f1b" +
              (ushaped ? ", ushaped: true" : "") + "}\n",
          std::move(opts));
  ExpectTheUncutStep(f, before, expected);
  if (HasFatalFailure()) return;
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 1u);
  const auto& chains = h[0].split.value().chains;
  ASSERT_EQ(chains.size(), 1u);
  // The owner's passes: a forward and a backward per micro-batch; by a budget of 1,024
  // tokens, sequences of 140 to 256 go three to seven at a time, not four equal eighths.
  int owner = 0;
  for (const auto& x : chains[0].spans) owner += x.device == 0;
  EXPECT_GT(owner / 2, 4) << "micro-batches";
  EXPECT_LE(owner / 2, 12);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Shapes, TokenBudgetExactnessTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "ushaped" : "line"; });

// Two chains of three train one model: the segments' replicas average across the chains,
// and the model learns over two rounds; int8 on every hop.
TEST(PipelineTest, TwoChainsOfThreeLearnOneModel) {
  auto init = Model::Create({"lenet5", "", 3});
  ASSERT_TRUE(init.ok());
  Dataset test = *LoadFashionMnist(kFmnist, false, 1000);
  const double before = (*init)->Evaluate(test, 256)->accuracy;
  auto opts = Options(6, 6000);
  for (int i = 2; i < 6; ++i) opts[i].peer_listen = "127.0.0.1:0";
  Federation f;
  f.Start(std::string(kBase) + "model: {name: lenet5}\nrun: {rounds: 2, seed: 3}\n" +
              "clients: {min: 6, quorum: 1.0}\n" +
              "train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}\n" +
              "compression: {activations: int8, gradients: int8}\n"
              "split: {mode: pipeline, cut: 3, devices: 3, micro_batches: 4}\n",
          std::move(opts));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 2u);
  for (const auto& r : h) {
    EXPECT_EQ(r.participants, 6);
    ASSERT_EQ(r.split.value().chains.size(), 2u);
    for (const auto& c : r.split.value().chains) {
      EXPECT_TRUE(c.done);
      EXPECT_EQ(c.bounds, (std::vector<int>{0, 1, 2, 3}));
      EXPECT_GE(c.bubble, 0);
      EXPECT_LE(c.bubble, 1);
    }
    EXPECT_GT(r.split.value().activation_bytes_up, 0);
    // The owners' examples (1,000 each) in whole batches of 32: 31 of them per chain.
    EXPECT_EQ(r.split.value().labels_up, 2 * 31 * 32);
  }
  // Owners are the clients that serve no Peer.
  EXPECT_EQ(h[0].split.value().chains[0].devices[0].substr(0, 7), "client-");
  EXPECT_LT(h[0].split.value().chains[0].devices[0], "client-2");
  EXPECT_GT(h[0].test_accuracy, before + 0.1) << "initial " << before;
  EXPECT_GT(h[1].test_accuracy, before + 0.3) << "initial " << before;
  EXPECT_LT(h[1].train_loss, h[0].train_loss);
}

// Secure aggregation per segment: two chains of two, each device's segment masked in one
// SecAgg+ round (a vector of every stage the devices train, zero outside its own), so
// that the server unmasks only the sums across chains; the model equals the same round's
// without masking up to SecAgg's quantization (2^24 levels over [-1, 1]).
TEST(PipelineTest, SecureAggregationMasksEverySegmentAndChangesNothingElse) {
  auto run = [](const std::string& secagg) {
    auto opts = Options(4, 640);
    for (int i = 2; i < 4; ++i) opts[i].peer_listen = "127.0.0.1:0";
    Federation f;
    f.Start(std::string(kBase) + "model: {name: lenet5}\nrun: {rounds: 1, seed: 5}\n" +
                "clients: {min: 4, quorum: 1.0}\n" +
                "train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.5}\n" +
                "split: {mode: pipeline, cut: 2, devices: 2, micro_batches: 2}\n" + secagg,
            std::move(opts));
    f.Join();
    EXPECT_TRUE(f.server_status.ok()) << f.server_status;
    for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
    auto h = f.server->History();
    EXPECT_EQ(h.size(), 1u);
    return std::make_pair(f.server->GlobalModel(), h.empty() ? RoundMetrics{} : h[0]);
  };
  const auto [plain_model, plain] = run("");
  const auto [masked_model, masked] = run("secure_aggregation: {k: 3, t: 2, bits: 24}\n");
  EXPECT_EQ(masked.participants, 4);
  ASSERT_EQ(masked.split.value().chains.size(), 2u);
  for (const auto& c : masked.split.value().chains) EXPECT_EQ(c.bounds, (std::vector<int>{0, 1, 2}));
  EXPECT_GT(MaxDiff(plain_model, masked_model), 0) << "masked, quantized: not bit for bit";
  EXPECT_LT(MaxDiff(plain_model, masked_model), 1e-5);
  // Each device uploaded the masked vector of both client stages (4 bytes a value), not
  // its own segment: the two convolutions' 2,572 parameters, four times.
  EXPECT_EQ(masked.update_bytes, 4 * 4 * (6 * 25 + 6 + 16 * 6 * 25 + 16));
  EXPECT_LT(plain.update_bytes, masked.update_bytes);
}

// LoRA per segment: a decoder of three blocks over a chain of three devices and the
// server; each device takes the frozen tensors of its own segment from a base of just
// those, and every block's adapters train (the server's too) while every frozen tensor
// stays as it was; the held-out loss falls below a uniform guess's.
TEST(PipelineTest, LoraAdaptersTrainInEverySegment) {
  auto clients = NaturalClients("text:/usr/share/games/fortunes,context=32", 3);
  for (int i = 1; i < 3; ++i) clients[i].peer_listen = "127.0.0.1:0";
  Federation f;
  f.Start("server: {heartbeat_s: 0.5, client_timeout_s: 30}\n"
          "model: {name: gpt, gpt: {vocab: 256, context: 32, layers: 3, heads: 4, dim: 64},"
          " lora: {rank: 4, alpha: 8}}\n"
          "data: {test: \"text:/usr/share/games/fortunes,context=32\", test_limit: 128}\n"
          "run: {rounds: 2, seed: 3}\nclients: {min: 3, quorum: 1.0}\n"
          "train: {optimizer: adamw, lr: 0.01, local_steps: 10, batch_size: 16}\n"
          "compression: {activations: int8:token, gradients: int8:token}\n"
          "split: {mode: pipeline, cut: 3, devices: 3, micro_batches: 4}\n",
          std::move(clients));
  const ParameterSet start = f.server->GlobalModel();
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
  int changed = 0;
  const ParameterSet end = f.server->GlobalModel();
  for (const Tensor& t : start.tensors()) {
    const bool adapter = t.name.find(".lora_") != std::string::npos;
    const bool same = end.Find(t.name)->values == t.values;
    if (!adapter) {
      EXPECT_TRUE(same) << t.name << " is frozen";
    }
    changed += adapter && !same;
  }
  EXPECT_EQ(changed, 3 * 4 * 2) << "A and B of the 4 projections of all three blocks";
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[0].split.value().chains.at(0).bounds, (std::vector<int>{0, 1, 2, 3}));
  // It learns: from about ln 256 = 5.55 nats (a uniform guess over the bytes).
  for (const auto& r : h) EXPECT_LT(r.test_loss, std::log(256.0) - 0.1);
}

// A device that drops in the middle of a round fails its chain's round at once (every
// device of the chain fails its task, none hangs); the other chain's round commits.
TEST(PipelineFailureTest, ADeviceThatDropsFailsItsChainOnly) {
  auto opts = Options(4, 1500);
  for (int i = 2; i < 4; ++i) opts[i].peer_listen = "127.0.0.1:0";
  // The relay of one chain drops after its fifth micro-batch.
  opts[3].crash_after_split_step = [](int64_t, int64_t step) { return step == 5; };
  Federation f;
  f.Start(std::string(kBase) + "model: {name: lenet5}\nrun: {rounds: 1, seed: 4}\n" +
              "clients: {min: 4, quorum: 0.5}\n" +
              "train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.5}\n" +
              "split: {mode: pipeline, cut: 2, devices: 2, micro_batches: 2}\n",
          std::move(opts));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  EXPECT_EQ(f.client_status[3].code(), absl::StatusCode::kAborted) << f.client_status[3];
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].participants, 2);
  EXPECT_EQ(h[0].failures, 2) << "the dropped device and its chain's owner";
  EXPECT_LT(h[0].wall_s, 20) << "the failure was noticed, not waited out";
  const auto& chains = h[0].split.value().chains;
  ASSERT_EQ(chains.size(), 2u);
  EXPECT_NE(chains[0].done, chains[1].done);
  int completed = 0;
  for (const auto& c : f.clients) completed += c->tasks_completed();
  EXPECT_EQ(completed, 2);
}

// Under secure aggregation a broken chain's devices are dropped clients of SecAgg+: the
// others unmask without them, and the round commits the surviving chains' segments.
TEST(PipelineFailureTest, ABrokenChainUnderSecureAggregationIsADroppedClient) {
  auto opts = Options(6, 640);
  for (int i = 3; i < 6; ++i) opts[i].peer_listen = "127.0.0.1:0";
  opts[5].crash_after_split_step = [](int64_t, int64_t step) { return step == 5; };
  Federation f;
  f.Start(std::string(kBase) + "model: {name: lenet5}\nrun: {rounds: 1, seed: 4}\n" +
              "clients: {min: 6, quorum: 0.5}\n" +
              "train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.5}\n" +
              "split: {mode: pipeline, cut: 2, devices: 2, micro_batches: 2}\n" +
              "secure_aggregation: {k: 5, t: 3}\n",
          std::move(opts));
  const ParameterSet start = f.server->GlobalModel();
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].participants, 4);
  EXPECT_EQ(h[0].failures, 2) << "the dropped device and its chain's owner";
  const auto& chains = h[0].split.value().chains;
  ASSERT_EQ(chains.size(), 3u);
  EXPECT_EQ(std::count_if(chains.begin(), chains.end(), [](const auto& c) { return c.done; }), 2);
  EXPECT_GT(MaxDiff(start, f.server->GlobalModel()), 1e-4) << "the surviving chains trained it";
}

}  // namespace
}  // namespace cleave
