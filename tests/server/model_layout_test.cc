// The coordinator's model layout: what updates carry (without personal, frozen and
// private tensors) and what blobs and checkpoints hold (without frozen and private).
#include "server/model_layout.h"

#include <gtest/gtest.h>

namespace cleave {
namespace {

ParameterSet Model() {
  ParameterSet m;
  for (const char* name : {"0.a", "1.b", "2.c", "3.d"}) {
    EXPECT_TRUE(m.Add(Tensor{name, {2}, {1, 2}}).ok());
  }
  return m;
}

std::vector<std::string> Names(const ParameterSet& s) {
  std::vector<std::string> out;
  for (const Tensor& t : s.tensors()) out.push_back(t.name);
  return out;
}

bool LastIsPrivate(const std::string& name) { return name == "3.d"; }

TEST(ModelLayoutTest, UpdatesLeaveOutPersonalFrozenAndPrivateTensorsAndBlobsFrozenAndPrivate) {
  const ParameterSet global = Model();
  auto layout = ModelLayout::Of(global, {"0.a"}, {"1.b"}, LastIsPrivate);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->not_updated(), (std::vector<std::string>{"0.a", "1.b", "3.d"}));
  EXPECT_FALSE(layout->updates_all());
  EXPECT_FALSE(layout->publishes_all());
  EXPECT_EQ(Names(layout->UpdateLayout(global)), std::vector<std::string>{"2.c"});
  EXPECT_EQ(Names(layout->Updated(global)), std::vector<std::string>{"2.c"});
  ParameterSet scratch;
  EXPECT_EQ(Names(layout->Published(global, scratch)), (std::vector<std::string>{"0.a", "2.c"}));
  EXPECT_EQ(layout->personal(), std::vector<std::string>{"0.a"});
  EXPECT_EQ(layout->frozen(), std::vector<std::string>{"1.b"});
}

TEST(ModelLayoutTest, AModelWithNothingSetAsideIsItsOwnLayoutWithoutACopy) {
  const ParameterSet global = Model();
  auto layout = ModelLayout::Of(global, {}, {}, nullptr);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_TRUE(layout->updates_all() && layout->publishes_all());
  EXPECT_EQ(&layout->UpdateLayout(global), &global);
  ParameterSet scratch;
  EXPECT_EQ(&layout->Published(global, scratch), &global);
  EXPECT_EQ(scratch.size(), 0u);
  EXPECT_EQ(Names(layout->Updated(global)), Names(global));
}

TEST(ModelLayoutTest, PersonalLayersCoveringTheWholeModelAreRefused) {
  const auto all = ModelLayout::Of(Model(), {"0.a", "1.b", "2.c", "3.d"}, {}, nullptr);
  EXPECT_EQ(all.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(all.status().message().find("nothing is federated"), std::string::npos) << all.status();
}

}  // namespace
}  // namespace cleave
