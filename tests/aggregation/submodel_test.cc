// Width-scaled submodels (aggregation/submodel.h): where a submodel's elements sit in the
// whole model's, with HeteroFL's leading window and FedRolex's rolled one, across a
// flatten; the leading blocks of per-device LoRA ranks; and the per-element mean of
// updates from devices of different widths, over the holders or zero-padded (HetLoRA).
#include "aggregation/submodel.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <numeric>
#include <vector>

namespace cleave {
namespace {

// A layer of 4 outputs over 3 inputs, then (after a flatten of 2 positions per channel)
// a layer of 2 outputs over 4 x 2; a submodel keeping 2 of the 4 channels.
ParameterSet Layout(int64_t channels) {
  ParameterSet p;
  EXPECT_TRUE(p.Add({"0.weight", {channels, 3}, std::vector<float>(channels * 3, 0)}).ok());
  EXPECT_TRUE(p.Add({"0.bias", {channels}, std::vector<float>(channels, 0)}).ok());
  EXPECT_TRUE(p.Add({"1.weight", {2, channels * 2}, std::vector<float>(2 * channels * 2, 0)}).ok());
  EXPECT_TRUE(p.Add({"1.bias", {2}, std::vector<float>(2, 0)}).ok());
  return p;
}

TEST(SubmodelTest, HeteroFlKeepsTheLeadingChannelsAndTheirBlocks) {
  auto p = SubmodelPositions(Layout(4), Layout(2), 0);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)[0], (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));  // rows 0 and 1, every input
  EXPECT_EQ((*p)[1], (std::vector<int64_t>{0, 1}));
  // Inputs of channels 0 and 1 (positions 0-1 and 2-3 of 8), both outputs.
  EXPECT_EQ((*p)[2], (std::vector<int64_t>{0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ((*p)[3], (std::vector<int64_t>{0, 1}));
}

TEST(SubmodelTest, FedRolexRollsTheWindowAndWrapsAround) {
  auto p = SubmodelPositions(Layout(4), Layout(2), 3);  // channels 3, then 0
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)[0], (std::vector<int64_t>{9, 10, 11, 0, 1, 2}));
  EXPECT_EQ((*p)[1], (std::vector<int64_t>{3, 0}));
  EXPECT_EQ((*p)[2], (std::vector<int64_t>{6, 7, 0, 1, 14, 15, 8, 9}));
  // The whole model is its own submodel at any roll.
  auto whole = SubmodelPositions(Layout(4), Layout(4), 3);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ((*whole)[2], (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
}

// A residual block whose shortcut (a 1x1 convolution) takes the block's inputs, not the
// last layer's outputs, each convolution followed by its normalization's weight and
// bias; then a classifier.
ParameterSet Residual(int64_t c) {
  ParameterSet p;
  for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"stem", {c, 1, 3, 3}}, {"stem.bn.weight", {c}}, {"stem.bn.bias", {c}},
           {"conv", {2 * c, c, 3, 3}}, {"bn.weight", {2 * c}}, {"bn.bias", {2 * c}},
           {"shortcut", {2 * c, c, 1, 1}}, {"shortcut.bn.weight", {2 * c}}, {"shortcut.bn.bias", {2 * c}},
           {"fc", {3, 2 * c}}, {"fc.bias", {3}}}) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    EXPECT_TRUE(p.Add({name, shape, std::vector<float>(n, 0)}).ok());
  }
  return p;
}

TEST(SubmodelTest, AShortcutTakesTheWindowOfTheBlocksInputs) {
  auto p = SubmodelPositions(Residual(4), Residual(2), 1);  // FedRolex: windows start at 1
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)[1], (std::vector<int64_t>{1, 2})) << "the stem's normalization: its channels";
  // The shortcut [8, 4, 1, 1]: rows 1-4 of 8, inputs the stem's kept channels 1 and 2.
  EXPECT_EQ((*p)[6], (std::vector<int64_t>{5, 6, 9, 10, 13, 14, 17, 18}));
  EXPECT_EQ((*p)[7], (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ((*p)[9], (std::vector<int64_t>{1, 2, 3, 4, 9, 10, 11, 12, 17, 18, 19, 20}));
}

TEST(SubmodelTest, RefusesWhatIsNotASubmodel) {
  EXPECT_FALSE(SubmodelPositions(Layout(2), Layout(4), 0).ok()) << "larger";
  ParameterSet renamed = Layout(2);
  renamed.mutable_tensors()[0].name = "x";
  EXPECT_FALSE(SubmodelPositions(Layout(4), renamed, 0).ok());
  ParameterSet odd = Layout(2);
  odd.mutable_tensors()[2] = {"1.weight", {2, 3}, std::vector<float>(6, 0)};  // 3 inputs: no kept block
  EXPECT_FALSE(SubmodelPositions(Layout(4), odd, 0).ok());
}

// Each element: the weighted mean over the devices that hold it; none: 0.
TEST(SubmodelTest, TheMeanIsPerElementOverItsHolders) {
  const ParameterSet whole = Layout(4);
  SubmodelSum sum(whole);
  auto half = *SubmodelPositions(whole, Layout(2), 0);
  ParameterSet small = Layout(2);
  for (auto& t : small.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), 1.0f);
  ASSERT_TRUE(sum.Add(ViewsOf(small), half, 1).ok());
  EXPECT_EQ(sum.Mean().tensors()[0].values[6], 0.0f) << "row 2: nobody yet";
  ParameterSet big = whole;
  for (auto& t : big.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), 3.0f);
  ASSERT_TRUE(sum.Add(ViewsOf(big), *SubmodelPositions(whole, whole, 0), 3).ok());
  const ParameterSet mean = sum.Mean();
  EXPECT_FLOAT_EQ(mean.tensors()[0].values[0], 2.5f);  // (1 x 1 + 3 x 3) / 4
  EXPECT_FLOAT_EQ(mean.tensors()[0].values[6], 3.0f);  // the big device's alone
  EXPECT_FLOAT_EQ(mean.tensors()[2].values[9], 2.5f);
  EXPECT_FLOAT_EQ(mean.tensors()[2].values[12], 3.0f);
  // An update of another layout changes nothing.
  EXPECT_FALSE(sum.Add(ViewsOf(small), *SubmodelPositions(whole, whole, 0), 1).ok());
  EXPECT_EQ(sum.Mean().tensors()[0].values, mean.tensors()[0].values);
}

// DP's view of a submodel update: its values in place, zeros elsewhere; and how many
// devices hold each element.
TEST(SubmodelTest, PlacedPadsWithZerosAndHoldersCount) {
  const ParameterSet whole = Layout(4);
  auto half = *SubmodelPositions(whole, Layout(2), 3);  // channels 3 and 0
  ParameterSet small = Layout(2);
  for (auto& t : small.mutable_tensors()) std::iota(t.values.begin(), t.values.end(), 1.0f);
  auto placed = Placed(ViewsOf(small), half, whole);
  ASSERT_TRUE(placed.ok()) << placed.status();
  ASSERT_TRUE(placed->SameLayout(whole));
  EXPECT_EQ(placed->tensors()[1].values, (std::vector<float>{2, 0, 0, 1}));  // bias: channel 3 first
  EXPECT_EQ(placed->tensors()[0].values[9], 1.0f);
  EXPECT_EQ(placed->tensors()[0].values[3], 0.0f) << "channel 1: not held";
  EXPECT_FALSE(Placed(ViewsOf(whole), half, whole).ok()) << "another layout";
  ParameterSet holders = whole.ZerosLike();
  CountHolders(half, &holders);
  CountHolders(*SubmodelPositions(whole, whole, 0), &holders);
  EXPECT_EQ(holders.tensors()[1].values, (std::vector<float>{2, 1, 1, 2}));
}

// A LoRA pair at rank 4, A [3, 4] and B [4, 2] (the decoder's Conv1D layout), and its
// rank-2 cut.
ParameterSet Adapters(int64_t rank) {
  ParameterSet p;
  EXPECT_TRUE(p.Add({"c.lora_A", {3, rank}, std::vector<float>(3 * rank, 0)}).ok());
  EXPECT_TRUE(p.Add({"c.lora_B", {rank, 2}, std::vector<float>(rank * 2, 0)}).ok());
  return p;
}

TEST(SubmodelTest, ALowerRankIsTheLeadingBlock) {
  auto p = LeadingPositions(Adapters(4), Adapters(2));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)[0], (std::vector<int64_t>{0, 1, 4, 5, 8, 9}));  // A's first 2 columns
  EXPECT_EQ((*p)[1], (std::vector<int64_t>{0, 1, 2, 3}));        // B's first 2 rows
  EXPECT_FALSE(LeadingPositions(Adapters(2), Adapters(4)).ok()) << "larger";
}

// HetLoRA: each device's values (start + delta) padded with zeros, averaged over all; an
// element one device lacks shrinks by its weight.
TEST(SubmodelTest, ZeroPaddingAveragesOverEveryDevice) {
  ParameterSet start = Adapters(4);
  for (auto& t : start.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), 2.0f);
  SubmodelSum sum(start);
  ParameterSet low = Adapters(2);  // weight 1, delta 1: values 3 on its block
  for (auto& t : low.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), 1.0f);
  ASSERT_TRUE(sum.Add(ViewsOf(low), *LeadingPositions(start, low), 1).ok());
  ParameterSet high = Adapters(4);  // weight 3, delta -1: values 1 everywhere
  for (auto& t : high.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), -1.0f);
  ASSERT_TRUE(sum.Add(ViewsOf(high), *LeadingPositions(start, high), 3).ok());
  const ParameterSet change = sum.ZeroPadded(start);
  // A[0][0]: (1 x 3 + 3 x 1) / 4 = 1.5, a change of -0.5; A[0][3]: (1 x 0 + 3 x 1) / 4.
  EXPECT_FLOAT_EQ(change.tensors()[0].values[0], -0.5f);
  EXPECT_FLOAT_EQ(change.tensors()[0].values[3], 0.75f - 2.0f);
  EXPECT_FLOAT_EQ(change.tensors()[1].values[7], 0.75f - 2.0f);  // B's last row
  // The holders' mean, for comparison: no shrinking.
  EXPECT_FLOAT_EQ(sum.Mean().tensors()[0].values[3], -1.0f);
}

// Robust rules element by element over the holders: three whole devices and one half
// device, one whole device hostile (100 everywhere).
TEST(SubmodelTest, RobustRulesApplyPerElementOverTheHolders) {
  const ParameterSet whole = Layout(4);
  auto full = std::make_shared<const std::vector<std::vector<int64_t>>>(*SubmodelPositions(whole, whole, 0));
  auto half = std::make_shared<const std::vector<std::vector<int64_t>>>(*SubmodelPositions(whole, Layout(2), 0));
  auto filled = [](ParameterSet p, float v) {
    for (auto& t : p.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), v);
    return p;
  };
  SubmodelUpdates u(whole);
  ASSERT_TRUE(u.Add(ViewsOf(filled(whole, 1)), full, 1).ok());
  ASSERT_TRUE(u.Add(ViewsOf(filled(whole, 2)), full, 1).ok());
  ASSERT_TRUE(u.Add(ViewsOf(filled(whole, 100)), full, 1).ok());
  ASSERT_TRUE(u.Add(ViewsOf(filled(Layout(2), 3)), half, 1).ok());
  EXPECT_FALSE(u.Add(ViewsOf(filled(Layout(2), 3)), full, 1).ok()) << "another layout";
  AggregationConfig c;
  c.rule = "median";
  auto median = u.Aggregate(c);
  ASSERT_TRUE(median.ok()) << median.status();
  EXPECT_FLOAT_EQ(median->tensors()[0].values[0], 2.5f);  // row 0: 1, 2, 3, 100
  EXPECT_FLOAT_EQ(median->tensors()[0].values[6], 2.0f);  // row 2: 1, 2, 100
  c.rule = "trimmed_mean";
  c.f = 1;
  auto trimmed = u.Aggregate(c);
  ASSERT_TRUE(trimmed.ok()) << trimmed.status();
  EXPECT_FLOAT_EQ(trimmed->tensors()[0].values[0], 2.5f);  // 2 and 3
  EXPECT_FLOAT_EQ(trimmed->tensors()[0].values[6], 2.0f);  // 2
  c.f = 2;
  auto too_few = u.Aggregate(c);
  EXPECT_EQ(too_few.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(too_few.status().message().find("held by 4 devices"), std::string::npos) << too_few.status();
  c.rule = "norm_bound";
  c.max_norm = 1;  // the hostile device's delta (norm 100 x sqrt(34)) shrinks to norm 1
  auto bounded = u.Aggregate(c);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  EXPECT_LT(bounded->tensors()[0].values[6], 1.0f);
  c.rule = "krum";
  EXPECT_EQ(u.Aggregate(c).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cleave
