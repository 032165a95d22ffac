// Language models federated over real gRPC in one process: Debian's fortunes, each
// client a share of the category files (the text source's natural partition).
#include <gtest/gtest.h>

#include "data/dataset.h"
#include "models/model.h"
#include "tests/integration/federation.h"

namespace cleave {
namespace {

constexpr char kText[] = "text:/usr/share/games/fortunes,context=32";

std::vector<ClientOptions> TextClients(int n) {
  auto all = LoadDataSpec(kText, true);
  EXPECT_TRUE(all.ok()) << all.status();
  auto parts = PartitionDataset(*all, "natural", n, 1);
  EXPECT_TRUE(parts.ok()) << parts.status();
  std::vector<ClientOptions> out;
  for (const auto& p : *parts) {
    ClientOptions o;
    o.train = all->Subset(p);
    out.push_back(std::move(o));
  }
  return out;
}

constexpr char kGpt[] = R"(
model: {name: gpt, gpt: {vocab: 256, context: 32, layers: 2, heads: 4, dim: 64}}
data: {test: "text:/usr/share/games/fortunes,context=32", test_limit: 256}
train: {optimizer: adamw, lr: 0.003, weight_decay: 0.01, local_steps: 30, batch_size: 16}
clients: {min: 3, quorum: 1.0}
server: {heartbeat_s: 0.5, client_timeout_s: 30}
)";

// FedAvg of a decoder over three clients' categories: the server's held-out perplexity
// starts near a uniform guess (256) and falls every round.
TEST(TextFederationTest, FortunesCategoriesFederateADecoder) {
  ModelSpec spec;
  spec.name = "gpt";
  spec.seed = 7;
  spec.gpt = {256, 32, 2, 4, 64, false};
  auto init = Model::Create(spec);
  ASSERT_TRUE(init.ok());
  auto test = LoadDataSpec("text:/usr/share/games/fortunes,context=32,limit=256", false);
  ASSERT_TRUE(test.ok());
  const double initial = (*init)->Evaluate(*test, 64)->metrics.at("perplexity");
  const auto h = RunToEnd(std::string(kGpt) + "run: {rounds: 3, seed: 7}\n", TextClients(3));
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

}  // namespace
}  // namespace cleave
