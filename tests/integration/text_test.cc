// Language models federated over real gRPC in one process: Debian's fortunes, each
// client a share of the category files (the text source's natural partition).
#include <gtest/gtest.h>

#include <filesystem>

#include "core/files.h"
#include "data/dataset.h"
#include "models/model.h"
#include "models/safetensors.h"
#include "server/checkpoint.h"
#include "tests/integration/federation.h"

namespace cleave {
namespace {

constexpr char kText[] = "text:/usr/share/games/fortunes,context=32";

constexpr char kFederation[] = R"(
data: {test: "text:/usr/share/games/fortunes,context=32", test_limit: 256}
clients: {min: 3, quorum: 1.0}
server: {heartbeat_s: 0.5, client_timeout_s: 30}
)";
// The model of these federations, as the config names it and as a ModelSpec.
constexpr char kGpt[] = "name: gpt, gpt: {vocab: 256, context: 32, layers: 2, heads: 4, dim: 64}";
ModelSpec Gpt() {
  ModelSpec spec;
  spec.name = "gpt";
  spec.seed = 7;
  spec.gpt = {256, 32, 2, 4, 64, false};
  return spec;
}

// FedAvg of a decoder over three clients' categories: the server's held-out perplexity
// starts near a uniform guess (256) and falls every round.
TEST(TextFederationTest, FortunesCategoriesFederateADecoder) {
  auto init = Model::Create(Gpt());
  ASSERT_TRUE(init.ok());
  auto test = LoadDataSpec("text:/usr/share/games/fortunes,context=32,limit=256", false);
  ASSERT_TRUE(test.ok());
  const double initial = (*init)->Evaluate(*test, 64)->metrics.at("perplexity");
  const auto h = RunToEnd(std::string(kFederation) + "model: {" + kGpt + "}\n" +
                              "train: {optimizer: adamw, lr: 0.003, weight_decay: 0.01, "
                              "local_steps: 30, batch_size: 16}\nrun: {rounds: 3, seed: 7}\n",
                          NaturalClients(kText, 3));
  ASSERT_EQ(h.size(), 3u);
  double last = initial;
  for (const auto& m : h) {
    EXPECT_EQ(m.participants, 3);
    const double ppl = m.test_metrics.at("perplexity");
    EXPECT_LT(ppl, last) << "round " << m.round;
    EXPECT_NEAR(m.test_metrics.at("bits_per_byte"), std::log2(ppl), 1e-9);
    last = ppl;
  }
  EXPECT_GT(initial, 200);
  EXPECT_LT(last, 25) << "initial " << initial;
  EXPECT_GT(h[0].bytes_up, 3 * 4 * (*init)->Parameters().total_elements());
}

// Federated evaluation of a language model: each client measures the global model on
// text it holds out, and the round reports the clients' perplexity (a weighted mean)
// and the spread of their losses: categories differ, so clients do.
TEST(TextFederationTest, ClientsReportTheirHeldOutPerplexity) {
  std::vector<ClientOptions> clients = NaturalClients(kText, 3);
  for (size_t i = 0; i < clients.size(); ++i) {
    clients[i].holdout = TakeHoldout(&clients[i].train, 0.05, 11 + i);
  }
  const auto h = RunToEnd(std::string("data: {test: \"\"}\nclients: {min: 3, quorum: 1.0}\n") +
                              "server: {heartbeat_s: 0.5, client_timeout_s: 30, final_evaluation: false}\n"
                              "model: {" + kGpt + "}\n" +
                              "train: {optimizer: adamw, lr: 0.003, local_steps: 30, batch_size: 16}\n"
                              "run: {rounds: 2, seed: 7}\n",
                          std::move(clients));
  ASSERT_EQ(h.size(), 2u);
  const auto& e = h[1].client_eval;  // the model of round 1, measured before round 2
  EXPECT_EQ(e.clients, 3);
  ASSERT_TRUE(e.metrics.count("perplexity")) << "the clients' metrics";
  EXPECT_LT(e.metrics.at("perplexity"), h[0].client_eval.metrics.at("perplexity"));
  EXPECT_LT(e.loss_min, e.loss_max);
  EXPECT_GT(e.loss_min, 0);
}

// LoRA fine-tuning of a base pretrained centrally on one category (model.weights, a
// GPT-2-layout safetensors file): clients upload and download adapters only (the frozen
// base travels once, in the first round), the held-out perplexity falls below the
// base's, the checkpoint holds the adapters, and a restarted server resumes exactly
// on the base it rebuilds.
TEST(TextFederationTest, LoraFineTunesAPretrainedBaseMovingOnlyAdapters) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "cleave_lora_federation";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto base = Model::Create(Gpt());
  ASSERT_TRUE(base.ok());
  LocalTrainOptions o;
  o.optimizer = "adamw";
  o.lr = 3e-3;
  o.batch_size = 16;
  o.local_steps = 100;
  ASSERT_TRUE((*base)->Train(*LoadDataSpec("text:/usr/share/games/fortunes/wisdom,context=32", true), o).ok());
  const std::string weights = (dir / "base.safetensors").string();
  ASSERT_TRUE(WriteFileAtomic(weights, SerializeSafetensors(ToGpt2Layout((*base)->Parameters()))).ok());
  auto test = LoadDataSpec("text:/usr/share/games/fortunes,context=32,limit=256", false);
  const double base_ppl = (*base)->Evaluate(*test, 64)->metrics.at("perplexity");
  const int64_t full_bytes = (*base)->Parameters().total_elements() * 4;

  const std::string yaml = std::string(kFederation) + "model: {" + kGpt + ", weights: " + weights +
                           ", lora: {rank: 2, alpha: 4}}\ntrain: {optimizer: adamw, lr: 0.01, "
                           "local_steps: 30, batch_size: 16}\n";
  std::vector<RoundMetrics> h;
  {
    Federation f;
    f.Start(yaml + "run: {rounds: 2, seed: 7}\n", NaturalClients(kText, 3), (dir / "run").string());
    f.Join();
    ASSERT_TRUE(f.server_status.ok()) << f.server_status;
    h = f.server->History();
  }
  ASSERT_EQ(h.size(), 2u);
  for (const auto& m : h) {
    EXPECT_LT(m.bytes_up, 3 * full_bytes / 20) << "round " << m.round << ": adapters only";
  }
  EXPECT_GT(h[0].bytes_down, 3 * full_bytes) << "the base, once";
  EXPECT_LT(h[1].bytes_down, 3 * full_bytes / 20) << "then adapters only";
  EXPECT_LT(h[1].test_metrics.at("perplexity"), base_ppl);
  auto bytes = ReadFile((dir / "run" / "checkpoint.pb").string());
  ASSERT_TRUE(bytes.ok());
  auto ck = DecodeCheckpoint(*bytes);
  ASSERT_TRUE(ck.ok()) << ck.status();
  EXPECT_EQ(ck->global.size(), 2u * 4 * 2);  // A and B of 4 projections in 2 blocks
  for (const Tensor& t : ck->global.tensors()) EXPECT_NE(t.name.find(".lora_"), std::string::npos);

  ServerOptions so;
  so.config = TestConfig(yaml + "run: {rounds: 3, seed: 7}\n");
  so.listen = "127.0.0.1:0";
  so.run_dir = (dir / "run").string();
  so.insecure = true;
  auto resumed = Server::Create(std::move(so));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ((*resumed)->committed_round(), 2);
  const ParameterSet model = (*resumed)->GlobalModel();
  for (const Tensor& t : ck->global.tensors()) EXPECT_EQ(model.Find(t.name)->values, t.values);
  EXPECT_EQ(model.Find("1.attn.c_attn.weight")->values,
            (*base)->Parameters().Find("1.attn.c_attn.weight")->values);
  resumed->reset();
  fs::remove_all(dir);
}

// Per-device LoRA ranks (width.method hetlora, flexlora): three clients train adapters
// of ranks 8, 4 and 2 of one decoder, each its rank's leading block, and the held-out
// perplexity falls with either aggregation rule.
TEST(TextFederationTest, DevicesOfThreeLoraRanksFineTuneOneDecoder) {
  auto init = Model::Create(Gpt());
  ASSERT_TRUE(init.ok());
  auto test = LoadDataSpec("text:/usr/share/games/fortunes,context=32,limit=256", false);
  const double initial = (*init)->Evaluate(*test, 64)->metrics.at("perplexity");
  for (const char* method : {"hetlora", "flexlora"}) {
    const auto h = RunToEnd(std::string(kFederation) + "model: {" + kGpt + ", lora: {rank: 8, alpha: 16}}\n" +
                                "train: {optimizer: adamw, lr: 0.01, local_steps: 20, batch_size: 16}\n"
                                "run: {rounds: 2, seed: 7}\nwidth: {method: " + method +
                                ", clients: [{name: client-1, rate: 0.5}, {name: client-2, rate: 0.25}]}\n",
                            NaturalClients(kText, 3));
    ASSERT_EQ(h.size(), 2u) << method;
    EXPECT_EQ(h[1].widths, (std::map<std::string, double>{{"client-0", 1.0}, {"client-1", 0.5}, {"client-2", 0.25}}));
    // 257.5 at the start, about 202 after the first round; after the second, 199.7
    // (flexlora) and 202.3 (hetlora) on one machine, below 202 for both on another: the
    // fall is the first round's, and which way the second moves is not this test's point.
    EXPECT_LT(h[0].test_metrics.at("perplexity"), initial * 0.9) << method;
    EXPECT_LT(h[1].test_metrics.at("perplexity"), initial * 0.9) << method;
  }
}

// Width-scaled decoders (width.method fedrolex on gpt): three clients train 1, 1/2 and
// 1/4 of every block's heads and MLP features, and the held-out perplexity falls.
TEST(TextFederationTest, DevicesOfThreeWidthsTrainOneDecoder) {
  auto init = Model::Create(Gpt());
  ASSERT_TRUE(init.ok());
  auto test = LoadDataSpec("text:/usr/share/games/fortunes,context=32,limit=256", false);
  const double initial = (*init)->Evaluate(*test, 64)->metrics.at("perplexity");
  const auto h = RunToEnd(std::string(kFederation) + "model: {" + kGpt + "}\n" +
                              "train: {optimizer: adamw, lr: 0.003, local_steps: 20, batch_size: 16}\n"
                              "run: {rounds: 2, seed: 7}\nwidth: {method: fedrolex, clients: "
                              "[{name: client-1, rate: 0.5}, {name: client-2, rate: 0.25}]}\n",
                          NaturalClients(kText, 3));
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(h[1].widths, (std::map<std::string, double>{{"client-0", 1.0}, {"client-1", 0.5}, {"client-2", 0.25}}));
  EXPECT_LT(h[0].test_metrics.at("perplexity"), initial);
  EXPECT_LT(h[1].test_metrics.at("perplexity"), h[0].test_metrics.at("perplexity"));
}

}  // namespace
}  // namespace cleave
