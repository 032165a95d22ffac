#include "split/round.h"

#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "models/model.h"

namespace cleave {
namespace {

// mlp: stage 0 holds tensors 0-1, stage 1 tensors 2-3, stage 2 tensors 4-5.
class SplitRoundTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = Model::Create({"mlp", "", 1});
    ASSERT_TRUE(m.ok());
    global_ = (*m)->Parameters();
  }

  std::unique_ptr<SplitRound> Make(SplitMode mode, std::map<std::string, int> cuts) {
    SplitRoundOptions o;
    o.mode = mode;
    o.model = {"mlp", "", 1};
    o.num_stages = 3;
    o.tail_begin = 3;
    o.stage_input_shapes = {{1, 28, 28}, {200}, {200}, {10}};
    auto r = SplitRound::Create(o, global_, cuts);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }

  // `client`'s part with every value raised by `by`.
  ParameterSet Trained(SplitRound& r, const std::string& client, float by) {
    ParameterSet p = *r.ClientPart(client);
    for (auto& t : p.mutable_tensors()) {
      for (float& v : t.values) v += by;
    }
    return p;
  }

  // next - global for tensor i, which must be the same for every value.
  double Shift(const ParameterSet& next, size_t i) {
    const auto& a = next.tensors()[i].values;
    const auto& g = global_.tensors()[i].values;
    const double d = a[0] - g[0];
    for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j] - g[j], d, 1e-5) << i << " " << j;
    return d;
  }

  ParameterSet global_;
};

TEST_F(SplitRoundTest, ClientPartsHoldTheStagesBeforeTheCut) {
  auto r = Make(SplitMode::kSflV2, {{"a", 1}, {"b", 2}});
  EXPECT_EQ(r->ClientPart("a")->size(), 2u);
  EXPECT_EQ(r->ClientPart("b")->size(), 4u);
  EXPECT_EQ(r->ClientPart("b")->tensors()[2].name, "1.0.weight");
  EXPECT_EQ(r->ClientPart("z").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(SplitRound::Create({}, global_, {{"a", 3}}).ok());
}

// Pipelines: two chains cut differently hold their segments; only a chain's last device
// streams to the server; each tensor averages over the chains' holders that trained it
// (the server's copies too: here untrained, equal to the global model), and a chain's
// ill-formed bounds are refused.
TEST_F(SplitRoundTest, PipelineChainsHoldSegmentsAndAveragePerTensor) {
  SplitRoundOptions o;
  o.mode = SplitMode::kPipeline;
  o.model = {"mlp", "", 1};
  o.num_stages = 3;
  o.tail_begin = 3;
  o.micro_batches = 2;
  o.stage_input_shapes = {{1, 28, 28}, {200}, {200}, {10}};
  // Chain x: a [0, 1), b [1, 2), the server [2, 3); chain y: c [0, 2), the server [2, 3).
  auto r = SplitRound::CreatePipeline(o, global_, {{{"a", "b"}, {0, 1, 2}}, {{"c"}, {0, 2}}});
  ASSERT_TRUE(r.ok()) << r.status();
  SplitRound& round = **r;
  EXPECT_EQ(*round.BeginOf("b"), 1);
  EXPECT_EQ(round.ClientPart("a")->size(), 2u);
  EXPECT_EQ(round.ClientPart("b")->tensors()[0].name, "1.0.weight");
  EXPECT_EQ(round.ClientPart("c")->size(), 4u);
  Activations act{{1, 200}, std::vector<float>(200, 0.1f)};
  EXPECT_EQ(round.TrainStep("a", act, {3}).status().code(), absl::StatusCode::kFailedPrecondition)
      << "the owner of a longer chain does not stream";
  ASSERT_TRUE(round.Finish("a", Trained(round, "a", 1), 10).ok());
  ASSERT_TRUE(round.Finish("b", Trained(round, "b", 1), 10).ok());
  ASSERT_TRUE(round.Finish("c", Trained(round, "c", 4), 30).ok());
  auto next = round.Aggregate();
  ASSERT_TRUE(next.ok());
  EXPECT_NEAR(Shift(*next, 0), (10 * 1 + 30 * 4) / 40.0, 1e-5);  // stage 0: a and c
  EXPECT_NEAR(Shift(*next, 2), (10 * 1 + 30 * 4) / 40.0, 1e-5);  // stage 1: b and c
  EXPECT_NEAR(Shift(*next, 4), 0, 1e-6);                          // stage 2: the two server copies
  for (const std::vector<SplitChain>& bad : std::vector<std::vector<SplitChain>>{
           {{{"a"}, {1, 2}}}, {{{"a", "b"}, {0, 2, 2}}}, {{{"a"}, {0, 3}}}, {{{"a"}, {0, 1}}, {{"a"}, {0, 2}}}}) {
    EXPECT_EQ(SplitRound::CreatePipeline(o, global_, bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// A U-shaped pipeline: the data owner also holds the head; the server's chain copy is the
// middle, runs forward and backward and steps after its batch's last backward pass; no
// labels reach it.
TEST_F(SplitRoundTest, AUShapedPipelineRunsTheMiddleOnTheChainsCopy) {
  SplitRoundOptions o;
  o.mode = SplitMode::kPipeline;
  o.model = {"mlp", "", 1};
  o.num_stages = 3;
  o.tail_begin = 2;
  o.micro_batches = 2;
  o.stage_input_shapes = {{1, 28, 28}, {200}, {200}, {10}};
  auto r = SplitRound::CreatePipeline(o, global_, {{{"a"}, {0, 1}}});
  ASSERT_TRUE(r.ok()) << r.status();
  SplitRound& round = **r;
  EXPECT_TRUE(round.ushaped());
  const ParameterSet part = *round.ClientPart("a");
  ASSERT_EQ(part.size(), 4u);
  EXPECT_EQ(part.tensors()[2].name, "2.0.weight");
  Activations act{{1, 200}, std::vector<float>(200, 0.1f)};
  EXPECT_EQ(round.TrainStep("a", act, {3}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(round.CheckLabels(act, {3}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(round.CheckLabels(act, {}).ok());
  Activations grad{{1, 200}, std::vector<float>(200, 1.0f)};
  ASSERT_TRUE(round.ForwardMiddle("a", 1, act).ok());
  ASSERT_TRUE(round.BackwardMiddle("a", 1, grad).ok());
  ASSERT_TRUE(round.Finish("a", part, 10).ok());
  EXPECT_NEAR(Shift(*round.Aggregate(), 2), 0, 1e-7) << "not the batch's end: no step yet";
  auto again = SplitRound::CreatePipeline(o, global_, {{{"a"}, {0, 1}}});
  ASSERT_TRUE(again.ok());
  for (int64_t seq : {1, 2}) {
    ASSERT_TRUE((*again)->ForwardMiddle("a", seq, act).ok());
    ASSERT_TRUE((*again)->BackwardMiddle("a", seq, grad, /*batch_end=*/seq == 2).ok());
  }
  ASSERT_TRUE((*again)->Finish("a", part, 10).ok());
  const ParameterSet next = *(*again)->Aggregate();
  EXPECT_GT(std::abs(next.tensors()[2].values[0] - global_.tensors()[2].values[0]), 1e-6) << "the middle stepped";
  EXPECT_EQ(next.tensors()[4].values, global_.tensors()[4].values) << "the head is the owner's (sent back unchanged)";
  grad.values[0] = NAN;
  EXPECT_EQ((*again)->BackwardMiddle("a", 3, grad).status().code(), absl::StatusCode::kInvalidArgument);
}

// Per tensor, the weighted mean over every holder. Nothing trained on the server here,
// so its copies equal the global model.
TEST_F(SplitRoundTest, SflV1AveragesClientPartsWithTheServerCopies) {
  auto r = Make(SplitMode::kSflV1, {{"a", 1}, {"b", 2}});
  ASSERT_TRUE(r->Finish("a", Trained(*r, "a", 1.0f), 1).ok());
  ASSERT_TRUE(r->Finish("b", Trained(*r, "b", 2.0f), 3).ok());
  auto next = r->Aggregate();
  ASSERT_TRUE(next.ok());
  EXPECT_NEAR(Shift(*next, 0), (1 * 1.0 + 3 * 2.0) / 4, 1e-6);  // both clients
  EXPECT_NEAR(Shift(*next, 2), (1 * 0.0 + 3 * 2.0) / 4, 1e-6);  // a's server copy, b
  EXPECT_NEAR(Shift(*next, 4), 0.0, 1e-6);                      // both server copies
}

TEST_F(SplitRoundTest, SflV2WeighsTheSharedPartByTheClientsItServed) {
  auto r = Make(SplitMode::kSflV2, {{"a", 1}, {"b", 2}, {"c", 1}});
  ASSERT_TRUE(r->Finish("a", Trained(*r, "a", 1.0f), 1).ok());
  ASSERT_TRUE(r->Finish("b", Trained(*r, "b", 2.0f), 3).ok());
  r->Fail("c");
  EXPECT_EQ(r->Finish("c", Trained(*r, "c", 9.0f), 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r->finished(), 2);
  auto next = r->Aggregate();
  ASSERT_TRUE(next.ok());
  EXPECT_NEAR(Shift(*next, 1), 1.75, 1e-6);
  // Stage 1: b holds it (weight 3); the shared part ran a's micro-batches (weight 1).
  EXPECT_NEAR(Shift(*next, 3), (3 * 2.0 + 1 * 0.0) / 4, 1e-6);
  EXPECT_NEAR(Shift(*next, 5), 0.0, 1e-6);
}

TEST_F(SplitRoundTest, SlHandsTheClientPartOn) {
  auto r = Make(SplitMode::kSl, {{"a", 1}, {"b", 2}});
  ASSERT_TRUE(r->Finish("a", Trained(*r, "a", 1.0f), 10).ok());
  // b starts from a's stage 0 and the server's stage 1.
  ParameterSet b = *r->ClientPart("b");
  EXPECT_NEAR(b.tensors()[0].values[0] - global_.tensors()[0].values[0], 1.0, 1e-6);
  EXPECT_NEAR(b.tensors()[2].values[0] - global_.tensors()[2].values[0], 0.0, 1e-6);
  ASSERT_TRUE(r->Finish("b", Trained(*r, "b", 2.0f), 1).ok());
  auto next = r->Aggregate();
  ASSERT_TRUE(next.ok());
  EXPECT_NEAR(Shift(*next, 0), 3.0, 1e-5);  // a's +1, then b's +2: not averaged
  EXPECT_NEAR(Shift(*next, 2), 2.0, 1e-5);
}

// The server's load: compute seconds of every step, and the span they fall in. Two
// clients stepping the shared part at once take turns, so busy never exceeds the span.
TEST_F(SplitRoundTest, ServerLoadCountsEveryStepOfTheSharedPart) {
  auto r = Make(SplitMode::kSflV2, {{"a", 1}, {"b", 1}});
  EXPECT_EQ(r->ServerLoad().busy_s, 0);
  EXPECT_EQ(r->ServerLoad().span_s, 0);
  Activations a;
  a.shape = {32, 200};
  a.values.assign(32 * 200, 0.5f);
  const std::vector<int64_t> labels(32, 3);
  auto steps = [&](const std::string& client) {
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(r->TrainStep(client, a, labels).ok());
  };
  std::thread ta(steps, "a"), tb(steps, "b");
  ta.join();
  tb.join();
  const SplitRound::Load load = r->ServerLoad();
  EXPECT_GT(load.busy_s, 0);
  EXPECT_LE(load.busy_s, load.span_s + 1e-6);
  // A refused step is not counted; the load only grows.
  ASSERT_FALSE(r->TrainStep("z", a, labels).ok());
  EXPECT_EQ(r->ServerLoad().busy_s, load.busy_s);
  ASSERT_TRUE(r->TrainStep("a", a, labels).ok());
  EXPECT_GT(r->ServerLoad().busy_s, load.busy_s);
  EXPECT_GT(r->ServerLoad().span_s, load.span_s);
}

TEST_F(SplitRoundTest, FinishChecksTheLayout) {
  auto r = Make(SplitMode::kSflV2, {{"a", 1}});
  EXPECT_EQ(r->Finish("a", global_, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r->Finish("a", Trained(*r, "a", 1.0f), 0).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave

namespace cleave {
namespace {

// A language model's micro-batch carries a label per token (B x T), each a token id
// below the vocabulary's size; anything else is refused, and a refused batch trains
// nothing.
TEST(SplitRoundTextTest, LabelsArePerTokenAndInTheVocabulary) {
  ModelSpec spec;
  spec.name = "gpt";
  spec.seed = 1;
  spec.gpt = {/*vocab=*/50, /*context=*/8, /*layers=*/2, /*heads=*/2, /*dim=*/16, false};
  auto m = Model::Create(spec);
  ASSERT_TRUE(m.ok());
  SplitRoundOptions o;
  o.mode = SplitMode::kSflV2;
  o.model = spec;
  o.num_stages = 4;
  o.tail_begin = 4;
  o.num_classes = 50;
  o.stage_input_shapes = {{8}, {8, 16}, {8, 16}, {8, 16}, {8, 50}};
  auto r = SplitRound::Create(o, (*m)->Parameters(), {{"a", 1}});
  ASSERT_TRUE(r.ok()) << r.status();
  Activations a;
  a.shape = {2, 8, 16};
  a.values.assign(2 * 8 * 16, 0.1f);
  ASSERT_TRUE((*r)->CheckActivations("a", a).ok());
  std::vector<int64_t> labels(16, 7);
  EXPECT_TRUE((*r)->CheckLabels(a, labels).ok());
  auto short_labels = (*r)->CheckLabels(a, std::vector<int64_t>(2, 7));
  EXPECT_NE(short_labels.message().find("2 labels for 2 samples of 8 tokens"), std::string::npos)
      << short_labels;
  labels[5] = 50;
  EXPECT_NE((*r)->CheckLabels(a, labels).message().find("label 50 is not in [0, 50)"),
            std::string::npos);
  labels[5] = 3;
  auto step = (*r)->TrainStep("a", a, labels);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->grad_in.shape, a.shape);
  EXPECT_NEAR(step->loss, std::log(50.0), 0.5);  // about uniform at the start
  // A micro-batch cut short (token budgets): 5 tokens a sequence, 5 labels each; not
  // longer than the context.
  Activations cut;
  cut.shape = {2, 5, 16};
  cut.values.assign(2 * 5 * 16, 0.1f);
  EXPECT_TRUE((*r)->CheckActivations("a", cut).ok());
  EXPECT_TRUE((*r)->CheckLabels(cut, std::vector<int64_t>(10, 3)).ok());
  EXPECT_FALSE((*r)->CheckLabels(cut, labels).ok());
  ASSERT_TRUE((*r)->TrainStep("a", cut, std::vector<int64_t>(10, 3)).ok());
  Activations longer;
  longer.shape = {2, 9, 16};
  longer.values.assign(2 * 9 * 16, 0.1f);
  EXPECT_EQ((*r)->CheckActivations("a", longer).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave
