// Local training options, losses and metrics, and the round learning-rate schedule
// against PyTorch's own torch.optim, clip_grad_norm_, losses and lr_scheduler and
// scikit-learn's metrics on the same inputs (tests/models/optim_reference.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/files.h"
#include "job/job.h"
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

// The reference's data: x[i][j] = sin(0.37 i + 1.3 j), 32 x 20; labels i mod `classes`
// (mod 2 for bce); regression targets 3 sin(0.5 i).
Dataset ReferenceData(const std::string& loss, int classes) {
  Dataset d;
  d.type = ExampleType::kFloat32;
  d.size = 32;
  d.shape = {20};
  d.num_classes = std::max(classes, 2);
  d.mean.clear();
  d.stddev.clear();
  const bool regression = loss == "mse" || loss == "mae" || loss == "ts_huber";
  std::vector<float> x;
  for (int i = 0; i < 32; ++i) {
    for (int j = 0; j < 20; ++j) x.push_back(static_cast<float>(std::sin(0.37 * i + 1.3 * j)));
    d.labels.push_back(regression ? 0 : i % d.num_classes);
    if (regression) d.targets.push_back(static_cast<float>(3 * std::sin(0.5 * i)));
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
  const char* loss = "cross_entropy";
  int classes = 3;  // the model's outputs
  // A loss the reference scripts (ts_focal, ts_huber) and cleave loads as "torchscript".
  const char* script = nullptr;
};

std::map<std::string, double> ReadMetrics(const fs::path& path) {
  std::ifstream in(path);
  std::map<std::string, double> out;
  std::string k;
  for (double v; in >> k >> v;) out[k] = v;
  return out;
}

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
             std::to_string(c.smoothing) + " 5 " + (c.script ? c.script : c.loss) + " " +
             std::to_string(c.classes));
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto m = Model::Create({"torchscript", *ReadFile((dir / "m.pt").string()), 0});
  ASSERT_TRUE(m.ok()) << m.status();
  if (c.script != nullptr) {
    auto archive = ReadFile((dir / "m.pt.loss.pt").string());
    ASSERT_TRUE(archive.ok()) << archive.status();
    ASSERT_TRUE((*m)->SetTorchScriptLoss(*archive).ok());
  }
  LocalTrainOptions o;
  o.optimizer = c.optimizer;
  o.lr = c.lr;
  o.momentum = c.momentum;
  o.nesterov = c.nesterov;
  o.weight_decay = c.weight_decay;
  o.clip_norm = c.clip;
  o.label_smoothing = c.smoothing;
  o.loss = c.loss;
  o.batch_size = 32;  // full batch: the order of examples cannot matter
  o.local_steps = 5;
  const ParameterSet start = (*m)->Parameters();
  const Dataset data = ReferenceData(c.script ? c.script : c.loss, c.classes);
  auto trained_stats = (*m)->Train(data, o);
  ASSERT_TRUE(trained_stats.ok()) << trained_stats.status();
  const std::vector<double> expected = ReadNumbers(dir / "w.txt");
  const auto expected_metrics = ReadMetrics(dir / "w.txt.metrics");
  fs::remove_all(dir);
  // The trained model's metrics against scikit-learn's on the reference's model.
  auto eval = (*m)->Evaluate(data, 32, c.loss);
  ASSERT_TRUE(eval.ok()) << eval.status();
  ASSERT_FALSE(expected_metrics.empty());
  for (const auto& [k, v] : expected_metrics) {
    const double ours = k == "loss" ? eval->loss : k == "accuracy" ? eval->accuracy : eval->metrics[k];
    EXPECT_NEAR(ours, v, 1e-5) << k;
  }
  EXPECT_EQ(eval->metrics.size() + 1 + (expected_metrics.count("accuracy") ? 1 : 0),
            expected_metrics.size())
      << "a metric sklearn was not asked for, or one we do not report";
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
                      OptimCase{"adamw_clipped", "adamw", 0.01, 0, false, 0.1, 0.1, 0.1},
                      OptimCase{"top5", "sgd", 0.1, 0.9, false, 0, 0, 0, "cross_entropy", 7},
                      OptimCase{"bce", "sgd", 0.2, 0.9, false, 0, 0, 0, "bce", 1},
                      OptimCase{"mse", "adam", 0.05, 0, false, 0, 0, 0, "mse", 1},
                      OptimCase{"mae", "sgd", 0.05, 0.9, false, 0, 0, 0, "mae", 1},
                      OptimCase{"torchscript_focal", "sgd", 0.5, 0.9, false, 0, 0, 0,
                                "torchscript", 3, "ts_focal"},
                      OptimCase{"torchscript_huber", "adam", 0.05, 0, false, 0, 0, 0,
                                "torchscript", 1, "ts_huber"}),
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
