// Local training options and the round learning-rate schedule against PyTorch's own
// torch.optim, clip_grad_norm_, label smoothing and lr_scheduler on the same inputs
// (tests/models/optim_reference.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/config.h"
#include "core/files.h"
#include "models/model.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

std::string Python(const std::string& args) {
  return std::string("/usr/bin/python3 ") + CLEAVE_SOURCE_DIR + "/tests/models/optim_reference.py " + args;
}

std::vector<double> ReadNumbers(const fs::path& path) {
  std::ifstream in(path);
  std::vector<double> out;
  for (double v; in >> v;) out.push_back(v);
  return out;
}

// The reference's data: x[i][j] = sin(0.37 i + 1.3 j), 32 x 20; y[i] = i mod 3.
Dataset ReferenceData() {
  Dataset d;
  d.type = ExampleType::kFloat32;
  d.size = 32;
  d.shape = {20};
  d.num_classes = 3;
  d.mean.clear();
  d.stddev.clear();
  std::vector<float> x;
  for (int i = 0; i < 32; ++i) {
    for (int j = 0; j < 20; ++j) x.push_back(static_cast<float>(std::sin(0.37 * i + 1.3 * j)));
    d.labels.push_back(i % 3);
  }
  d.bytes.resize(x.size() * sizeof(float));
  std::memcpy(d.bytes.data(), x.data(), d.bytes.size());
  return d;
}

struct OptimCase {
  const char* name;
  const char* optimizer;
  double lr, momentum;
  bool nesterov;
  double weight_decay, clip, smoothing;
};

void PrintTo(const OptimCase& c, std::ostream* os) { *os << c.name; }

class OptimizerMatchesPyTorchTest : public ::testing::TestWithParam<OptimCase> {};

TEST_P(OptimizerMatchesPyTorchTest, SameWeightsAfterFiveSteps) {
  const OptimCase& c = GetParam();
  const fs::path dir = fs::temp_directory_path() / ("cleave_optim_" + std::to_string(getpid()) + c.name);
  fs::create_directories(dir);
  const std::string cmd =
      Python("train " + (dir / "m.pt").string() + " " + (dir / "w.txt").string() + " " + c.optimizer + " " +
             std::to_string(c.lr) + " " + std::to_string(c.momentum) + " " + (c.nesterov ? "1" : "0") +
             " " + std::to_string(c.weight_decay) + " " + std::to_string(c.clip) + " " +
             std::to_string(c.smoothing) + " 5");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto m = Model::Create({"torchscript", *ReadFile((dir / "m.pt").string()), 0});
  ASSERT_TRUE(m.ok()) << m.status();
  LocalTrainOptions o;
  o.optimizer = c.optimizer;
  o.lr = c.lr;
  o.momentum = c.momentum;
  o.nesterov = c.nesterov;
  o.weight_decay = c.weight_decay;
  o.clip_norm = c.clip;
  o.label_smoothing = c.smoothing;
  o.batch_size = 32;  // full batch: the order of examples cannot matter
  o.local_steps = 5;
  const ParameterSet start = (*m)->Parameters();
  ASSERT_TRUE((*m)->Train(ReferenceData(), o).ok());
  const std::vector<double> expected = ReadNumbers(dir / "w.txt");
  fs::remove_all(dir);
  std::vector<double> ours, initial;
  const ParameterSet trained = (*m)->Parameters();
  for (const auto& t : trained.tensors()) ours.insert(ours.end(), t.values.begin(), t.values.end());
  for (const auto& t : start.tensors()) initial.insert(initial.end(), t.values.begin(), t.values.end());
  ASSERT_EQ(ours.size(), expected.size());
  double max_change = 0, max_diff = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    max_change = std::max(max_change, std::abs(expected[i] - initial[i]));
    max_diff = std::max(max_diff, std::abs(expected[i] - ours[i]));
  }
  EXPECT_GT(max_change, 1e-3) << "the reference did not train";
  EXPECT_LT(max_diff, 1e-5) << "largest change " << max_change;
}

INSTANTIATE_TEST_SUITE_P(
    Local, OptimizerMatchesPyTorchTest,
    ::testing::Values(OptimCase{"sgd_momentum_wd", "sgd", 0.1, 0.9, false, 0.01, 0, 0},
                      OptimCase{"sgd_nesterov", "sgd", 0.1, 0.9, true, 0, 0, 0},
                      OptimCase{"sgd_clipped", "sgd", 0.5, 0, false, 0, 0.05, 0},
                      OptimCase{"sgd_label_smoothing", "sgd", 0.1, 0, false, 0, 0, 0.2},
                      OptimCase{"adam", "adam", 0.01, 0, false, 0.01, 0, 0},
                      OptimCase{"adamw_clipped", "adamw", 0.01, 0, false, 0.1, 0.1, 0.1}),
    [](const auto& info) { return std::string(info.param.name); });

struct ScheduleCase {
  const char* name;
  const char* kind;
  int warmup, step_rounds;
  double gamma, lr_min;
};

void PrintTo(const ScheduleCase& c, std::ostream* os) { *os << c.name; }

class ScheduleMatchesPyTorchTest : public ::testing::TestWithParam<ScheduleCase> {};

TEST_P(ScheduleMatchesPyTorchTest, SameRateEveryRound) {
  const ScheduleCase& c = GetParam();
  const fs::path out = fs::temp_directory_path() / ("cleave_sched_" + std::to_string(getpid()) + c.name);
  TrainConfig t;
  t.lr = 0.1;
  t.schedule = c.kind;
  t.warmup_rounds = c.warmup;
  t.step_rounds = c.step_rounds;
  t.step_gamma = c.gamma;
  t.lr_min = c.lr_min;
  const int rounds = 20;
  const std::string cmd = Python("schedule " + out.string() + " " + c.kind + " 0.1 " +
                                 std::to_string(rounds) + " " + std::to_string(c.warmup) + " " +
                                 std::to_string(c.step_rounds) + " " + std::to_string(c.gamma) +
                                 " " + std::to_string(c.lr_min));
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::vector<double> expected = ReadNumbers(out);
  fs::remove(out);
  ASSERT_EQ(expected.size(), static_cast<size_t>(rounds));
  for (int r = 1; r <= rounds; ++r) {
    EXPECT_NEAR(ScheduledLr(t, r, rounds), expected[r - 1], 1e-9) << "round " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rounds, ScheduleMatchesPyTorchTest,
    ::testing::Values(ScheduleCase{"constant", "constant", 0, 10, 0.1, 0},
                      ScheduleCase{"step", "step", 0, 6, 0.5, 0},
                      ScheduleCase{"cosine", "cosine", 0, 10, 0.1, 0.001},
                      ScheduleCase{"warmup_cosine", "cosine", 4, 10, 0.1, 0.0},
                      ScheduleCase{"warmup_step", "step", 3, 5, 0.3, 0}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace cleave
