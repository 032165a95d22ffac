// Models, losses and optimizers by registration: each registered from this file alone
// (a build function, a loss, a step) is what Model::Create, Model::Train and
// Model::Evaluate use when a job names it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "models/builtin_models.h"
#include "models/kinds.h"
#include "models/losses.h"
#include "models/model.h"
#include "models/names.h"
#include "models/optimizers.h"
#include "models/options.h"

namespace cleave {
namespace {

// "tiny": two stages, flatten then one linear layer.
torch::nn::Sequential BuildTiny(const ModelSpec& s) {
  torch::nn::Sequential seq;
  seq->push_back(torch::nn::Flatten());
  seq->push_back(torch::nn::Linear(s.input_shape[0], s.num_classes));
  return seq;
}

// "halfsgd": plain SGD at half the learning rate.
void HalfSgd(const LocalTrainOptions& o, int64_t, at::Tensor p, at::Tensor g, at::Tensor&,
             at::Tensor&) {
  p.add_(g, -o.lr / 2);
}

// "halfce": half the cross entropy.
at::Tensor HalfCrossEntropy(const LossBatch& b) {
  auto o = torch::nn::functional::CrossEntropyFuncOptions();
  if (b.sum) o.reduction(torch::kSum);
  return 0.5 * torch::nn::functional::cross_entropy(b.out, b.labels, o);
}

// "tinyown": tiny whose linear layer (stage 1) each device keeps for itself.
bool TinyOwn(const std::string& tensor) { return tensor.rfind("1.", 0) == 0; }

const bool kRegistered = [] {
  bool ok = AddModel("tiny", {BuildTiny}, ModelTraits{}).ok();
  ModelTraits own;
  own.scales = true;
  own.private_tensor = TinyOwn;
  ok &= AddModel("tinyown", {BuildTiny}, own).ok();
  ok &= Optimizers().Add("halfsgd", {false, HalfSgd}).ok();
  ok &= Losses().Add("halfce", {LossTask::kClasses, HalfCrossEntropy}).ok();
  return ok;
}();

Dataset Points() {
  Dataset d;
  d.type = ExampleType::kFloat32;
  d.shape = {4};
  d.num_classes = 3;
  d.mean.clear();
  d.stddev.clear();
  std::vector<float> values;
  for (int i = 0; i < 24; ++i) {
    for (int j = 0; j < 4; ++j) values.push_back(std::sin(1.0f + i * 0.7f + j * 1.3f));
    d.labels.push_back(i % 3);
  }
  d.size = 24;
  d.bytes.resize(values.size() * sizeof(float));
  std::memcpy(d.bytes.data(), values.data(), d.bytes.size());
  return d;
}

// The change one full-batch step of `optimizer` and `loss` at `lr` makes to model tiny.
ParameterSet OneStep(const std::string& optimizer, const std::string& loss, double lr) {
  auto model = Model::Create({"tiny", "", 3, {4}, 3});
  EXPECT_TRUE(model.ok()) << model.status();
  const ParameterSet before = (*model)->Parameters();
  LocalTrainOptions o;
  o.optimizer = optimizer;
  o.loss = loss;
  o.lr = lr;
  o.momentum = 0;
  o.local_steps = 1;
  o.batch_size = 24;
  auto stats = (*model)->Train(Points(), o);
  EXPECT_TRUE(stats.ok()) << stats.status();
  ParameterSet delta = (*model)->Parameters();
  for (size_t i = 0; i < delta.size(); ++i) {
    for (size_t j = 0; j < delta.tensors()[i].values.size(); ++j) {
      delta.mutable_tensors()[i].values[j] -= before.tensors()[i].values[j];
    }
  }
  return delta;
}

void ExpectScaled(const ParameterSet& a, const ParameterSet& b, double factor) {
  double moved = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = 0; j < a.tensors()[i].values.size(); ++j) {
      const double want = factor * b.tensors()[i].values[j];
      EXPECT_NEAR(a.tensors()[i].values[j], want, 1e-6 + 1e-4 * std::abs(want));
      moved += std::abs(want);
    }
  }
  EXPECT_GT(moved, 1e-3) << "the step moved the model";
}

TEST(ModelRegistryTest, ARegisteredModelIsBuiltByName) {
  ASSERT_TRUE(kRegistered);
  auto model = Model::Create({"tiny", "", 3, {4}, 3});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->num_stages(), 2);
  EXPECT_EQ((*model)->Parameters().total_elements(), 4 * 3 + 3);
  auto unknown = Model::Create({"tinyx", "", 3, {4}, 3});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("model.name: unknown 'tinyx'"), std::string::npos)
      << unknown.status();
  EXPECT_NE(unknown.status().message().find("tiny,"), std::string::npos) << unknown.status();
  EXPECT_EQ(AddModel("tiny", {}, {}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(AddModel("torchscript", {BuildTiny}, {}).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(Models().Has("torchscript"));
}

// What the rest of the code asks of a kind comes from its registration line: the checks
// of the model section treat tinyown like the kind whose traits it shares (interop's own
// tensors, a width-scaled mlp's submodels), under its own name.
TEST(ModelRegistryTest, ARegisteredModelsTraitsAreWhatItsRegistrationSays) {
  ASSERT_TRUE(kRegistered);
  const KnownTraits own = ModelTraitsOf("tinyown");
  EXPECT_TRUE(own.known);
  EXPECT_TRUE(own.scales);
  EXPECT_FALSE(own.tokens() || own.hf_folder || own.scripted || own.gpt2 || own.batch_norm);
  ASSERT_TRUE(own.has_private_tensors());
  EXPECT_TRUE(own.private_tensor("1.weight"));
  EXPECT_FALSE(own.private_tensor("0.weight"));
  EXPECT_FALSE(ModelTraitsOf("tiny").scales);
  EXPECT_FALSE(ModelTraitsOf("tiny").has_private_tensors());

  ModelConfig c;
  c.name = "tinyown";
  c.input = {4};
  c.classes = 3;
  EXPECT_TRUE(CheckModel(c).ok()) << CheckModel(c);
  c.personal = {"0.*"};  // a device's own tensors and personal layers do not combine
  const Status s = CheckModel(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("without model.personal"), std::string::npos) << s;
  c.personal.clear();
  c.quantize = "int8";  // a quantized base is a Hugging Face folder's
  EXPECT_NE(CheckModel(c).message().find("model.quantize"), std::string::npos) << CheckModel(c);
  c.quantize = "none";
  c.lora.rank = 4;  // adapters are a language model's
  EXPECT_NE(CheckModel(c).message().find("model.lora"), std::string::npos) << CheckModel(c);

  // The built-in kinds, and those that are no registered architecture.
  EXPECT_TRUE(ModelTraitsOf("hf").hf_folder && ModelTraitsOf("hf").tokens());
  EXPECT_TRUE(ModelTraitsOf("gpt").gpt2 && !ModelTraitsOf("gpt").hf_folder);
  EXPECT_TRUE(ModelTraitsOf("resnet").batch_norm && !ModelTraitsOf("cnn").batch_norm);
  EXPECT_TRUE(ModelTraitsOf("interop").has_private_tensors());
  EXPECT_FALSE(ModelTraitsOf("vgg").scales);
  EXPECT_TRUE(ModelTraitsOf("torchscript").known && ModelTraitsOf("torchscript").scripted);
  EXPECT_FALSE(ModelTraitsOf("tinyx").known);
  EXPECT_TRUE(ScriptedLoss("torchscript"));
  EXPECT_FALSE(ScriptedLoss("halfce") || ScriptedLoss("cross_entropy") || ScriptedLoss("nosuchloss"));
}

// The built-in kinds' builders (models/builtin_models.cc) and traits (models/kinds.cc,
// LibTorch-free) are two lists: each kind is in both, torchscript (no builder of ours)
// in the traits only.
TEST(ModelRegistryTest, EveryKindHasABuilderAndTraits) {
  for (const std::string& name : Models().Names()) {
    EXPECT_TRUE(ModelKinds().Has(name)) << name << " has no traits";
  }
  for (const std::string& name : ModelKinds().Names()) {
    EXPECT_EQ(Models().Has(name), name != "torchscript") << name;
  }
}

TEST(ModelRegistryTest, ARegisteredOptimizerStepsTraining) {
  ASSERT_TRUE(kRegistered);
  EXPECT_TRUE(OptimizerNames().Has("halfsgd"));
  ExpectScaled(OneStep("halfsgd", "cross_entropy", 0.1), OneStep("sgd", "cross_entropy", 0.1), 0.5);
}

TEST(ModelRegistryTest, ARegisteredLossTrainsAndEvaluates) {
  ASSERT_TRUE(kRegistered);
  EXPECT_TRUE(LossNames().Has("halfce"));
  // Half the loss, half the gradient: one SGD step at twice the rate is the same step.
  ExpectScaled(OneStep("sgd", "halfce", 0.2), OneStep("sgd", "cross_entropy", 0.1), 1.0);
  auto model = Model::Create({"tiny", "", 3, {4}, 3});
  ASSERT_TRUE(model.ok());
  auto half = (*model)->Evaluate(Points(), 8, "halfce");
  auto full = (*model)->Evaluate(Points(), 8, "cross_entropy");
  ASSERT_TRUE(half.ok() && full.ok()) << half.status() << full.status();
  EXPECT_NEAR(half->loss, 0.5 * full->loss, 1e-6);
  EXPECT_EQ(half->accuracy, full->accuracy);
  EXPECT_EQ(half->per_class_accuracy.size(), 3u) << "a classes loss's metrics";
}

}  // namespace
}  // namespace cleave
