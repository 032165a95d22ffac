// The same federation on Fashion-MNIST read from each data source: rendered by this test
// into PNG class folders, CIFAR-10 binary batches (padded to 32x32x3) and CSV, it must
// train to the accuracy of the IDX files it came from (same seed, within noise).
// `cleave local` as a user runs it; labelled slow (four federations).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/files.h"
#include "data/dataset.h"
#include "tests/data/render.h"
#include "tests/e2e/processes.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

class EquivalenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("cleave_equivalence_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    const std::string idx = "idx:/usr/share/datasets/fashion-mnist";
    Dataset train = *LoadDataSpec(idx + ",limit=6000", true);
    Dataset test = *LoadDataSpec(idx + ",limit=1000", false);
    testing::WriteImageFolder(train, dir_ / "png" / "train");
    testing::WriteImageFolder(test, dir_ / "png" / "test");
    testing::WriteCifar10(train, dir_ / "cifar", true);
    testing::WriteCifar10(test, dir_ / "cifar", false);
    testing::WriteCsv(train, dir_ / "train.csv");
    testing::WriteCsv(test, dir_ / "test.csv");
  }
  static void TearDownTestSuite() {
    if (!getenv("KEEP")) fs::remove_all(dir_);
  }

  // Runs a federation of `model` on `model_input` with clients on `train` and the server
  // on `test`; returns its final test accuracy.
  double Run(const std::string& name, const std::string& model, const std::string& model_input,
             const std::string& train, const std::string& test) {
    const fs::path config = dir_ / (name + ".yaml");
    std::ofstream(config) << "run: {name: " << name << ", rounds: 3, seed: 5}\n"
                          << "model: {name: " << model << ", input: " << model_input << "}\n"
                          << "data: {test: \"" << test << "\"}\n"
                          << "clients: {min: 3, quorum: 1.0, round_deadline_s: 120}\n"
                          << "train: {local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}\n"
                          << "local: {data: \"" << train << "\", partition: iid, clients: 3}\n";
    const fs::path run = dir_ / ("run-" + name);
    const std::string out = (dir_ / (name + ".out")).string();
    const int rc = testing::WaitForExit(
        testing::SpawnBinary({"cleave", "local", "--config", config.string(), "--run-dir",
                              run.string(), "--insecure"},
                             out),
        600);
    EXPECT_EQ(rc, 0) << ReadFile(out).value_or("");
    std::ifstream metrics(run / "metrics.jsonl");
    nlohmann::json last;
    for (std::string line; std::getline(metrics, line);) last = nlohmann::json::parse(line);
    return last.value("test_accuracy", 0.0);
  }

  static fs::path dir_;
};

fs::path EquivalenceTest::dir_;

TEST_F(EquivalenceTest, EverySourceTrainsLikeIdx) {
  // Each source normalised as the IDX path is (Fashion-MNIST's mean and stddev).
  const std::string norm = ",mean=0.286,std=0.353";
  const std::string idx_train = "idx:/usr/share/datasets/fashion-mnist,limit=6000";
  const std::string idx_test = "idx:/usr/share/datasets/fashion-mnist,limit=1000";
  // Images: LeNet-5 on the IDX files, the PNG folders (the same pixels, another order of
  // examples) and CIFAR batches (3x32x32: the classic LeNet-5 input, a larger first conv).
  const double idx = Run("idx", "lenet5", "[1, 28, 28]", idx_train, idx_test);
  const std::string png = "folder:" + (dir_ / "png").string() + ",channels=1" + norm;
  const double folder = Run("png", "lenet5", "[1, 28, 28]", png, png);
  const std::string cifar = "cifar10:" + (dir_ / "cifar").string() + norm;
  const double cifar_acc = Run("cifar", "lenet5", "[3, 32, 32]", cifar, cifar);
  // Tables: the MLP on the IDX files and on the CSV rows (784 features).
  const double idx_mlp = Run("idx-mlp", "mlp", "[1, 28, 28]", idx_train, idx_test);
  const double csv = Run("csv", "mlp", "[784]", "csv:" + (dir_ / "train.csv").string() + norm,
                         "csv:" + (dir_ / "test.csv").string() + norm);
  std::cout << "final test accuracy: lenet5 idx " << idx << ", png folder " << folder
            << ", cifar " << cifar_acc << "; mlp idx " << idx_mlp << ", csv " << csv << "\n";
  EXPECT_GT(idx, 0.7);
  EXPECT_GT(idx_mlp, 0.75);
  EXPECT_NEAR(folder, idx, 0.02);
  EXPECT_NEAR(cifar_acc, idx, 0.03);
  EXPECT_NEAR(csv, idx_mlp, 0.01);
}

}  // namespace
}  // namespace cleave
