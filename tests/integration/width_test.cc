// Width-scaled submodels end to end (job section width): real clients of three widths
// train LeNet-5 together and the whole model learns; FedRolex's rolling window reaches
// channels that HeteroFL's leading one never does.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "tests/integration/federation.h"

namespace cleave {
namespace {

constexpr char kWidthBase[] = R"(
model: {name: lenet5}
data: {test_limit: 1000}
server: {heartbeat_s: 0.5, client_timeout_s: 30}
train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.5}
)";

TEST(WidthTest, DevicesOfThreeWidthsTrainOneModel) {
  Federation f;
  f.Start(std::string(kWidthBase) + "run: {rounds: 3, seed: 3}\nclients: {min: 3, quorum: 1.0}\n" +
              "width: {method: fedrolex, clients: [{name: client-1, rate: 0.5}, {name: client-2, rate: 0.25}]}\n",
          Options(3, 6000));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 3u);
  for (const auto& r : h) {
    EXPECT_EQ(r.participants, 3);
    EXPECT_EQ(r.widths, (std::map<std::string, double>{{"client-0", 1.0}, {"client-1", 0.5}, {"client-2", 0.25}}));
  }
  // It learns (0.1 at the start): 0.72 after three rounds in a run of this test.
  EXPECT_GT(h[2].test_accuracy, 0.45);
  EXPECT_LT(h[2].test_loss, h[0].test_loss);
}

// ResNet submodels with static batch normalization: three devices at widths 1, 1/2 and
// 1/4 train one model (its residual shortcuts and normalization weights sliced with their
// channels) and it learns.
TEST(WidthTest, ResNetSubmodelsWithStaticBatchNormTrainOneModel) {
  Federation f;
  f.Start("model: {name: resnet, batch_norm: static}\ndata: {test_limit: 500}\n"
          "server: {heartbeat_s: 0.5, client_timeout_s: 60}\n"
          "train: {local_epochs: 1, batch_size: 32, lr: 0.1, momentum: 0.9}\n"
          "run: {rounds: 3, seed: 3}\nclients: {min: 3, quorum: 1.0}\n"
          "width: {clients: [{name: client-1, rate: 0.5}, {name: client-2, rate: 0.25}]}\n",
          Options(3, 1000));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[2].participants, 3);
  EXPECT_EQ(f.server->GlobalModel().Find("0.1.running_mean"), nullptr);
  EXPECT_GT(h[2].test_accuracy, 0.45) << "it learns (0.1 at the start; 0.55 in a run of this test)";
}

// Async buffers of submodels (scheduler.mode: async): three devices of three widths
// train continuously from the newest version, FedRolex's windows moving with it; stale
// uploads are placed by their own version's windows, and the model learns.
TEST(WidthTest, DevicesOfThreeWidthsFillAsyncBuffers) {
  Federation f;
  f.Start(std::string(kWidthBase) + "run: {rounds: 6, seed: 3}\nclients: {min: 3}\n" +
              "scheduler: {mode: async, buffer_size: 2, max_staleness: 3}\n"
              "width: {method: fedrolex, clients: [{name: client-1, rate: 0.5}, {name: client-2, rate: 0.25}]}\n",
          Options(3, 2000));
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 6u);
  std::set<double> rates;
  for (const auto& r : h) {
    EXPECT_EQ(r.participants, 2);
    for (const auto& [name, rate] : r.widths) rates.insert(rate);
  }
  EXPECT_EQ(rates, (std::set<double>{0.25, 0.5, 1.0})) << "every tier's uploads went into some buffer";
  EXPECT_LT(h[5].test_loss, h[0].test_loss - 0.3) << "it learns (2.29 to 1.34-1.68 in runs of this test)";
  EXPECT_GT(h[5].test_accuracy, 0.3) << "0.1 at the start";
}

// Width-scaled submodels under an update codec: each device's int8 upload is decoded in
// its submodel's layout, a quarter of the fp32 bytes, and the model still learns.
TEST(WidthTest, SubmodelsUploadThroughACodec) {
  auto run = [](const std::string& codec) {
    Federation f;
    f.Start(std::string(kWidthBase) + "run: {rounds: 2, seed: 3}\nclients: {min: 3, quorum: 1.0}\n" +
                "width: {clients: [{name: client-1, rate: 0.5}, {name: client-2, rate: 0.25}]}\n" +
                "compression: {update: " + codec + "}\n",
            Options(3, 3000));
    f.Join();
    EXPECT_TRUE(f.server_status.ok()) << f.server_status;
    for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
    return f.server->History();
  };
  const auto fp32 = run("none"), int8 = run("int8");
  ASSERT_EQ(int8.size(), 2u);
  ASSERT_EQ(fp32.size(), 2u);
  EXPECT_EQ(int8[1].participants, 3);
  EXPECT_LT(int8[1].bytes_up, fp32[1].bytes_up * 0.3) << "about a quarter, framing included";
  EXPECT_GT(int8[1].test_accuracy, 0.4) << "it learns (0.1 at the start)";
}

// A robust rule per element: among four devices of two widths one sends Gaussian noise;
// the holders' median keeps the model learning, where their mean makes a model whose
// next round diverges on every device (the run fails).
TEST(WidthTest, TheHoldersMedianWithstandsAHostileDevice) {
  auto run = [](const std::string& rule) {
    std::vector<ClientOptions> clients = Options(4, 4000);
    clients[3].attack = "gaussian";
    Federation f;
    f.Start(std::string(kWidthBase) + "run: {rounds: 2, seed: 3}\nclients: {min: 4, quorum: 1.0}\n" +
                "width: {clients: [{name: client-2, rate: 0.5}]}\naggregation: {rule: " + rule + "}\n",
            std::move(clients));
    f.Join();
    return std::pair{f.server_status, f.server->History()};
  };
  const auto [median_status, median] = run("median");
  ASSERT_TRUE(median_status.ok()) << median_status;
  ASSERT_EQ(median.size(), 2u);
  EXPECT_GT(median[1].test_accuracy, 0.3) << "0.1 at the start";
  const auto [mean_status, mean] = run("mean");
  EXPECT_TRUE(!mean_status.ok() || mean.back().test_accuracy + 0.2 < median[1].test_accuracy) << mean_status;
}

// DP-FedAvg on submodels: each device's update is clipped whole and the noised sum is
// divided per element by its holders. With no noise and a clip no update reaches, a
// round is HeteroFL's mean (the devices hold equal examples); with clipping and noise
// the model still learns, and the accountant's epsilon is reported.
TEST(WidthTest, DpClipsEachSubmodelAndDividesByTheHolders) {
  auto run = [](int rounds, const std::string& dp) {
    Federation f;
    f.Start(std::string(kWidthBase) + "run: {rounds: " + std::to_string(rounds) +
                ", seed: 3}\nclients: {min: 3, quorum: 1.0}\n" +
                "width: {clients: [{name: client-1, rate: 0.5}, {name: client-2, rate: 0.25}]}\n" + dp,
            Options(3, 3000));
    f.Join();
    EXPECT_TRUE(f.server_status.ok()) << f.server_status;
    return std::pair{f.server->GlobalModel(), f.server->History()};
  };
  const auto [plain, plain_h] = run(1, "");
  const auto [exact, exact_h] = run(1, "dp: {noise_multiplier: 1e-12, clip: 1e6}\n");
  EXPECT_LT(MaxDiff(plain, exact), 1e-5) << "the holders' mean";
  const auto [noised, h] = run(2, "dp: {noise_multiplier: 0.01, clip: 2}\n");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_GT(h[1].strategy_stats.at("epsilon"), 0);
  EXPECT_EQ(h[1].strategy_stats.at("dp_clip"), 2);
  EXPECT_GT(h[1].test_accuracy, 0.3) << "it learns (0.1 at the start)";
}

// FedDF on width-scaled submodels (width.distill): the server distils the devices'
// trained submodels into the whole model on unlabeled images it holds (the training
// set past the clients'), so the round's model differs from HeteroFL's mean alone, and
// it still learns.
TEST(WidthTest, FedDfDistilsTheDevicesSubmodelsIntoTheWholeModel) {
  auto run = [](const std::string& distill) {
    Federation f;
    f.Start(std::string(kWidthBase) + "run: {rounds: 2, seed: 3}\nclients: {min: 3, quorum: 1.0}\n" +
                "width: {clients: [{name: client-1, rate: 0.5}, {name: client-2, rate: 0.25}]" + distill + "}\n",
            Options(3, 3000));
    f.Join();
    EXPECT_TRUE(f.server_status.ok()) << f.server_status;
    return std::pair{f.server->GlobalModel(), f.server->History()};
  };
  const auto [plain, plain_h] = run("");
  const auto [distilled, h] = run(
      ", distill: {data: \"fmnist:/usr/share/datasets/fashion-mnist,offset=50000,limit=2000\", steps: 50}");
  ASSERT_EQ(h.size(), 2u);
  EXPECT_NE(plain.tensors()[0].values, distilled.tensors()[0].values);
  EXPECT_GT(h[1].test_accuracy, 0.4) << "it learns (0.1 at the start)";
}

// One device at width 1/2 for two rounds: HeteroFL trains conv1's first 3 of 6 output
// channels only; FedRolex's window moves on by one, so the fourth trains too.
TEST(WidthTest, FedRolexReachesChannelsHeteroFlLeaves) {
  auto trained_channels = [](const std::string& method) {
    Federation f;
    f.Start(std::string(kWidthBase) + "run: {rounds: 2, seed: 3}\nclients: {min: 1}\n" +
                "width: {method: " + method + ", rate: 0.5}\n",
            Options(1, 500));
    const ParameterSet start = f.server->GlobalModel();
    f.Join();
    EXPECT_TRUE(f.server_status.ok()) << f.server_status;
    const ParameterSet end = f.server->GlobalModel();
    const Tensor& before = *start.Find("0.0.weight");  // [6, 1, 5, 5]
    const Tensor& after = *end.Find("0.0.weight");
    std::vector<bool> trained(6, false);
    for (size_t i = 0; i < before.values.size(); ++i) trained[i / 25] = trained[i / 25] || before.values[i] != after.values[i];
    return trained;
  };
  EXPECT_EQ(trained_channels("heterofl"), (std::vector<bool>{true, true, true, false, false, false}));
  EXPECT_EQ(trained_channels("fedrolex"), (std::vector<bool>{true, true, true, true, false, false}));
}

// Three devices with bases of three architectures (mlp, lenet5, cnn) under one block.
constexpr char kInterop[] = R"(
model: {name: interop, interop: {base: mlp, width: 32, clients: [{name: client-1, base: lenet5}, {name: client-2, base: cnn}]}}
data: {test: ""}
server: {heartbeat_s: 0.5, client_timeout_s: 30}
train: {local_epochs: 1, batch_size: 32, optimizer: adam, lr: 0.002}
run: {rounds: 3, seed: 3}
clients: {min: 3, quorum: 1.0}
)";

// The server never changed a device's own tensors (its copy of the bases and fusions)
// and changed every shared one; the shared block's size.
int64_t ExpectOnlyTheBlockChanged(const ParameterSet& start, const ParameterSet& end) {
  int64_t shared = 0;
  for (size_t t = 0; t < start.size(); ++t) {
    const Tensor& a = start.tensors()[t];
    if (InteropPrivate(a.name)) {
      EXPECT_EQ(a.values, end.tensors()[t].values) << a.name << " is a device's own";
    } else {
      EXPECT_NE(a.values, end.tensors()[t].values) << a.name << " is shared";
      shared += a.numel();
    }
  }
  return shared;
}

// Interoperable architectures (model.name interop): three devices with private bases of
// three architectures (mlp, lenet5, cnn) share one block. Only the shared block travels
// (each upload is its size), the server never changes a base, and the clients'
// federated accuracy on their held-out data rises.
TEST(InteropTest, ThreeBasesShareOneBlock) {
  std::vector<ClientOptions> clients = Options(3, 3000);
  for (size_t i = 0; i < clients.size(); ++i) clients[i].holdout = TakeHoldout(&clients[i].train, 0.1, 11 + i);
  Federation f;
  f.Start(kInterop, std::move(clients));
  const ParameterSet start = f.server->GlobalModel();
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
  const auto h = f.server->History();
  ASSERT_EQ(h.size(), 4u) << "three rounds, then the clients' final evaluation";
  EXPECT_TRUE(h[3].evaluation_only);
  const int64_t shared = ExpectOnlyTheBlockChanged(start, f.server->GlobalModel());
  EXPECT_EQ(shared, 32 * 32 + 32 + 10 * 32 + 10);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(h[r].participants, 3);
    EXPECT_LT(h[r].bytes_up, 3 * (4 * shared + 4096)) << "the shared block only";
  }
  // Each row's client evaluation is of the model before that round's training; the
  // final one, of the last model.
  ASSERT_EQ(h[3].client_eval.clients, 3);
  EXPECT_GT(h[3].client_eval.accuracy, h[1].client_eval.accuracy);
  EXPECT_GT(h[3].client_eval.accuracy, 0.5) << "0.1 at the start";
}

// One interop split federation of `config` (three devices of three bases, three rounds):
// nothing of a device's own stages travels either way (its upload is `uploaded` values:
// none, or U-shaped its tail's), the server never changes them, the block learns, and
// each device's own stages train (the loss falls).
void ExpectTheServersBlockLearns(const std::string& config, int64_t uploaded = 0) {
  Federation f;
  f.Start(config, Options(3, 2000));
  const ParameterSet start = f.server->GlobalModel();
  f.Join();
  ASSERT_TRUE(f.server_status.ok()) << f.server_status;
  for (const auto& s : f.client_status) EXPECT_TRUE(s.ok()) << s;
  const auto h = f.server->History();
  ASSERT_GE(h.size(), 3u);
  ExpectOnlyTheBlockChanged(start, f.server->GlobalModel());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(h[r].participants, 3);
    ASSERT_TRUE(h[r].split.has_value());
    EXPECT_GT(h[r].split.value().activation_bytes_up, 0);
    EXPECT_GE(h[r].update_bytes, 3 * 4 * uploaded);
    EXPECT_LT(h[r].update_bytes, 3 * (4 * uploaded + 512)) << "nothing of the devices' own stages";
  }
  EXPECT_LT(h[2].train_loss, h[0].train_loss - 0.2) << "the devices' bases and the block learn";
}

// Interoperable architectures in split learning (sfl-v2, and sl's turns; cut 2): each
// device runs its own base and fusion and sends the fusion's activations; the server
// trains the shared block on all of them. U-shaped, each device also keeps the block's
// classifier (its tail, with the labels), which alone it uploads and the server averages.
TEST(InteropTest, ThreeBasesShareTheServersBlockAcrossTheCut) {
  for (const char* mode : {"sfl-v2", "sl"}) {
    SCOPED_TRACE(mode);
    ExpectTheServersBlockLearns(std::string(kInterop) + "split: {mode: " + mode + ", cut: 2}\n");
  }
  SCOPED_TRACE("ushaped");
  ExpectTheServersBlockLearns(std::string(kInterop) + "split: {mode: ushaped, cut: 2}\n", 10 * 32 + 10);
}

}  // namespace
}  // namespace cleave
