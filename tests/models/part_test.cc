#include "models/part.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <numeric>
#include <random>
#include <thread>

#include "models/names.h"

namespace cleave {
namespace {

Activations Random(std::vector<int64_t> shape, uint64_t seed) {
  Activations a;
  a.shape = shape;
  a.values.resize(NumElements(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n;
  for (auto& v : a.values) v = n(rng);
  return a;
}

void ExpectSameParameters(const ParameterSet& a, const ParameterSet& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a.tensors()[i].name, b.tensors()[i].name) << what;
    for (size_t j = 0; j < a.tensors()[i].values.size(); ++j) {
      ASSERT_NEAR(a.tensors()[i].values[j], b.tensors()[i].values[j], 1e-5)
          << what << ": " << a.tensors()[i].name << "[" << j << "]";
    }
  }
}

// Split learning trains with the job's optimizer: a part covering the whole model steps
// exactly as whole-model training does (itself checked against torch.optim in
// optim_test), for every optimizer with weight decay, gradient clipping and label
// smoothing; and a model cut in two (Forward, TrainWithLoss, Backward) steps as the
// whole part does, each side keeping its own optimizer state.
TEST(ModelPartTest, EveryOptimizerStepsAsWholeModelTraining) {
  constexpr int kExamples = 32, kSteps = 3;
  Dataset data;
  data.size = kExamples;
  data.shape = {1, 28, 28};
  const Activations pixels = Random({kExamples, 1, 28, 28}, 9);
  for (float v : pixels.values) data.bytes.push_back(static_cast<uint8_t>(std::min(255.0f, std::abs(v) * 80)));
  for (int i = 0; i < kExamples; ++i) data.labels.push_back(i % 10);
  std::vector<int64_t> all(kExamples);
  std::iota(all.begin(), all.end(), 0);
  const Activations input = InputBatch(data, all);
  const ModelSpec spec{"mlp", "", 4};
  for (const std::string& optimizer : OptimizerNames().names) {
    for (double clip : {0.0, 0.05}) {
      const std::string what = optimizer + (clip > 0 ? " clipped" : "");
      LocalTrainOptions t;
      t.optimizer = optimizer;
      t.lr = optimizer == "sgd" ? 0.1 : 0.003;
      t.momentum = optimizer == "sgd" ? 0.9 : 0.0;
      t.nesterov = optimizer == "sgd";
      t.weight_decay = 0.01;
      t.clip_norm = clip;
      t.label_smoothing = 0.1;
      t.local_steps = kSteps;
      t.batch_size = kExamples;  // one full batch per step: the order does not matter
      auto model = Model::Create(spec);
      ASSERT_TRUE(model.ok()) << model.status();
      ASSERT_TRUE((*model)->Train(data, t).ok()) << what;

      auto whole = ModelPart::Create(spec, 0, 3);
      ASSERT_TRUE(whole.ok()) << whole.status();
      ASSERT_TRUE((*whole)->ResetOptimizer(t).ok());
      for (int s = 0; s < kSteps; ++s) ASSERT_TRUE((*whole)->TrainWithLoss(input, data.labels).ok());
      ExpectSameParameters((*model)->Parameters(), (*whole)->Parameters(), what);
      if (clip > 0) continue;  // clipping bounds each part's own norm: a cut model differs

      auto head = ModelPart::Create(spec, 0, 1), tail = ModelPart::Create(spec, 1, 3);
      ASSERT_TRUE(head.ok() && tail.ok());
      ASSERT_TRUE((*head)->ResetOptimizer(t).ok() && (*tail)->ResetOptimizer(t).ok());
      for (int s = 0; s < kSteps; ++s) {
        auto act = (*head)->Forward(s, input);
        ASSERT_TRUE(act.ok()) << act.status();
        auto step = (*tail)->TrainWithLoss(*act, data.labels);
        ASSERT_TRUE(step.ok()) << step.status();
        ASSERT_TRUE((*head)->Backward(s, step->grad_in).ok());
      }
      ParameterSet cut = (*head)->Parameters();
      const ParameterSet tail_params = (*tail)->Parameters();
      for (const auto& tensor : tail_params.tensors()) ASSERT_TRUE(cut.Add(tensor).ok());
      ExpectSameParameters((*whole)->Parameters(), cut, what + " cut at 1");
    }
  }
  LocalTrainOptions bogus;
  bogus.optimizer = "lbfgs";
  EXPECT_EQ((*ModelPart::Create(spec, 0, 3))->ResetOptimizer(bogus).code(),
            absl::StatusCode::kInvalidArgument);
}

// A micro-batch still pending when another one steps the part back-propagates through
// the weights its forward pass used (weight stashing), and steps the live weights.
TEST(ModelPartTest, PendingMicroBatchesUseTheWeightsTheirForwardUsed) {
  // mlp stage 2 is Linear(200, 10): the input gradient is grad_out x W, the weight
  // gradient grad_out^T x input whatever W is.
  auto part = ModelPart::Create({"mlp", "", 1}, 2, 3);
  ASSERT_TRUE(part.ok()) << part.status();
  const double lr = 0.5;
  LocalTrainOptions sgd;
  sgd.lr = lr;
  ASSERT_TRUE((*part)->ResetOptimizer(sgd).ok());
  const ParameterSet w0 = (*part)->Parameters();
  const Activations a = Random({4, 200}, 1), b = Random({4, 200}, 2);
  ASSERT_TRUE((*part)->Forward(1, a).ok());
  ASSERT_TRUE((*part)->Forward(2, b).ok());
  EXPECT_EQ((*part)->pending(), 2u);
  const Activations g = Random({4, 10}, 3);
  ASSERT_TRUE((*part)->Backward(1, g).ok());
  auto gin = (*part)->Backward(2, g);
  ASSERT_TRUE(gin.ok()) << gin.status();
  const auto& w = w0.tensors()[0];  // "2.0.weight", [10, 200]
  ASSERT_EQ(w.shape, (std::vector<int64_t>{10, 200}));
  const ParameterSet after = (*part)->Parameters();
  const auto& w2 = after.tensors()[0];
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 200; ++c) {
      double expect = 0;
      for (int k = 0; k < 10; ++k) expect += g.values[r * 10 + k] * w.values[k * 200 + c];
      ASSERT_NEAR(gin->values[r * 200 + c], expect, 1e-4) << "not the stashed weights";
    }
  }
  // Two plain SGD steps, each with its batch's weight gradient g^T x input.
  for (int k = 0; k < 10; ++k) {
    for (int c = 0; c < 200; ++c) {
      double grad = 0;
      for (int r = 0; r < 4; ++r) {
        grad += g.values[r * 10 + k] * (a.values[r * 200 + c] + b.values[r * 200 + c]);
      }
      ASSERT_NEAR(w2.values[k * 200 + c], w.values[k * 200 + c] - lr * grad, 1e-4);
    }
  }
  EXPECT_EQ((*part)->pending(), 0u);
  EXPECT_EQ((*part)->Backward(2, g).status().code(), absl::StatusCode::kNotFound);
}

// SplitGuard's probe: the first tensor's weight gradient of one micro-batch (for mlp
// stage 2, grad_out^T x input); a probe that does not step leaves every weight and
// every later step as if it never ran, one that steps is Backward.
TEST(ModelPartTest, AProbeReturnsTheFirstGradientAndStepsOnlyWhenAsked) {
  auto part = ModelPart::Create({"mlp", "", 1}, 2, 3);
  ASSERT_TRUE(part.ok()) << part.status();
  LocalTrainOptions sgd;
  sgd.lr = 0.5;
  ASSERT_TRUE((*part)->ResetOptimizer(sgd).ok());
  const ParameterSet w0 = (*part)->Parameters();
  const Activations a = Random({4, 200}, 1), g = Random({4, 10}, 3);
  ASSERT_TRUE((*part)->Forward(1, a).ok());
  auto probe = (*part)->BackwardProbe(1, g, /*step=*/false);
  ASSERT_TRUE(probe.ok()) << probe.status();
  ASSERT_EQ(probe->first_gradient.size(), 2000u);  // "2.0.weight", [10, 200]
  for (int k = 0; k < 10; ++k) {
    for (int c = 0; c < 200; ++c) {
      double grad = 0;
      for (int r = 0; r < 4; ++r) grad += g.values[r * 10 + k] * a.values[r * 200 + c];
      ASSERT_NEAR(probe->first_gradient[k * 200 + c], grad, 1e-4);
    }
  }
  EXPECT_EQ(probe->grad_in.values.size(), 800u);
  ExpectSameParameters((*part)->Parameters(), w0, "after a probe without a step");
  // The dropped gradient does not reach the next step.
  ASSERT_TRUE((*part)->Forward(2, a).ok());
  auto stepped = (*part)->BackwardProbe(2, g, /*step=*/true);
  ASSERT_TRUE(stepped.ok());
  const ParameterSet w1 = (*part)->Parameters();
  for (size_t i = 0; i < 2000; ++i) {
    ASSERT_NEAR(w1.tensors()[0].values[i], w0.tensors()[0].values[i] - 0.5 * stepped->first_gradient[i], 1e-5);
  }
  (*part)->SetAccumulate(2);
  ASSERT_TRUE((*part)->Forward(3, a).ok());
  EXPECT_EQ((*part)->BackwardProbe(3, g, true).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A diverged part (here: activations so large that the logits overflow) takes no step
// and says so, rather than passing a non-finite gradient on.
TEST(ModelPartTest, ANonFiniteLossTakesNoStep) {
  auto part = ModelPart::Create({"mlp", "", 1}, 2, 3);
  ASSERT_TRUE(part.ok()) << part.status();
  LocalTrainOptions sgd;
  ASSERT_TRUE((*part)->ResetOptimizer(sgd).ok());
  const ParameterSet before = (*part)->Parameters();
  Activations huge = Random({4, 200}, 1);
  for (float& v : huge.values) v = v > 0 ? 3e38f : -3e38f;
  auto step = (*part)->TrainWithLoss(huge, {0, 1, 2, 3});
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition) << step.status();
  ExpectSameParameters((*part)->Parameters(), before, "after a non-finite loss");
  auto fine = (*part)->TrainWithLoss(Random({4, 200}, 2), {0, 1, 2, 3});
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_TRUE(std::isfinite(fine->loss));
}

// What a stage's forward pass keeps is this thread's tensors alone: another thread
// allocating and freeing large buffers meanwhile (a simulation's other clients
// training) changes nothing of it.
TEST(ModelPartTest, ProfilesCountOnlyTheirOwnThreadsTensors) {
  ModelSpec spec{"lenet5", "", 1};
  auto quiet = ProfileStages(spec, {1, 28, 28}, 32, 2);
  ASSERT_TRUE(quiet.ok()) << quiet.status();
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    std::vector<std::vector<char>> held;
    while (!stop) {
      held.emplace_back(4 << 20, 'x');  // 4 MiB from glibc's heap
      if (held.size() > 8) held.clear();
    }
  });
  auto loaded = ProfileStages(spec, {1, 28, 28}, 32, 2);
  stop = true;
  busy.join();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(quiet->size(), loaded->size());
  for (size_t i = 0; i < quiet->size(); ++i) {
    EXPECT_GE((*quiet)[i].saved_bytes, 4 * (*quiet)[i].out_elements) << "stage " << i << " keeps its output";
    EXPECT_EQ((*quiet)[i].saved_bytes, (*loaded)[i].saved_bytes) << "stage " << i;
  }
}

TEST(DistanceCorrelationTest, KnownCases) {
  const Activations x = Random({64, 5}, 1);
  EXPECT_NEAR(*DistanceCorrelation(x, x), 1.0, 1e-5);
  Activations affine = x;
  for (auto& v : affine.values) v = 3 * v - 2;
  EXPECT_NEAR(*DistanceCorrelation(x, affine), 1.0, 1e-5) << "invariant to scale and shift";
  const Activations big = Random({256, 5}, 3);
  EXPECT_LT(*DistanceCorrelation(big, Random({256, 5}, 4)), 0.3) << "independent samples";
  EXPECT_FALSE(DistanceCorrelation(x, Random({32, 5}, 2)).ok());
}

// NoPeek: with only the distance-correlation term (zero gradient from the server), the
// head learns to decorrelate its activations from its input; without it nothing moves.
TEST(ModelPartTest, NoPeekLowersTheDistanceCorrelationOfTheActivations) {
  auto dcor_after = [](double alpha) {
    auto part = ModelPart::Create({"mlp", "", 1}, 0, 1);
    EXPECT_TRUE(part.ok());
    LocalTrainOptions sgd;
    sgd.lr = 0.05;
    sgd.momentum = 0.9;
    EXPECT_TRUE((*part)->ResetOptimizer(sgd).ok());
    (*part)->SetNoPeek(alpha);
    const Activations x = Random({64, 1, 28, 28}, 5);
    const double before = *DistanceCorrelation(x, *(*part)->Forward(0, x));
    for (int step = 1; step <= 60; ++step) {
      auto out = (*part)->Forward(step, x);
      Activations zero = *out;
      std::fill(zero.values.begin(), zero.values.end(), 0.0f);
      EXPECT_TRUE((*part)->Backward(step, zero).ok());
    }
    const double after = *DistanceCorrelation(x, *(*part)->Forward(999, x));
    return std::pair{before, after};
  };
  const auto [b0, a0] = dcor_after(0);
  EXPECT_NEAR(a0, b0, 1e-6) << "no NoPeek, no gradient: unchanged";
  const auto [b1, a1] = dcor_after(1.0);
  EXPECT_LT(a1, b1 - 0.05) << "before " << b1;
}

// Over accumulated micro-batches NoPeek's term is their mean, as the loss is: two equal
// micro-batches accumulated step as one of them alone does.
TEST(ModelPartTest, NoPeekOverMicroBatchesIsTheirMean) {
  auto step = [](int micro_batches) {
    auto part = ModelPart::Create({"mlp", "", 1}, 0, 1);
    EXPECT_TRUE(part.ok());
    LocalTrainOptions sgd;
    sgd.lr = 0.5;
    EXPECT_TRUE((*part)->ResetOptimizer(sgd).ok());
    (*part)->SetNoPeek(1.0);
    if (micro_batches > 1) (*part)->SetAccumulate(micro_batches);
    const Activations x = Random({16, 1, 28, 28}, 5);
    for (int m = 0; m < micro_batches; ++m) {
      Activations zero = *(*part)->Forward(m, x);
      std::fill(zero.values.begin(), zero.values.end(), 0.0f);
      EXPECT_TRUE((*part)->Backward(m, zero).ok());
    }
    if (micro_batches > 1) {
      EXPECT_TRUE((*part)->Step().ok());
    }
    return (*part)->Parameters();
  };
  const ParameterSet one = step(1), two = step(2);
  double diff = 0, moved = 0;
  const ParameterSet start = (*ModelPart::Create({"mlp", "", 1}, 0, 1))->Parameters();
  for (size_t i = 0; i < one.size(); ++i) {
    for (size_t j = 0; j < one.tensors()[i].values.size(); ++j) {
      diff = std::max<double>(diff, std::abs(one.tensors()[i].values[j] - two.tensors()[i].values[j]));
      moved = std::max<double>(moved, std::abs(one.tensors()[i].values[j] - start.tensors()[i].values[j]));
    }
  }
  EXPECT_GT(moved, 1e-5) << "the term moved the weights";
  EXPECT_LT(diff, 1e-6);
}

}  // namespace
}  // namespace cleave
