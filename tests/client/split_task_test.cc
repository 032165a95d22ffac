// A split task's settings from the server are checked before the device opens a stream:
// privacy settings that are not finite or out of range fail the task.
#include <gtest/gtest.h>

#include <limits>

#include "client/split_client.h"
#include "models/part.h"

namespace cleave {
namespace {

TEST(SplitTaskTest, RefusesBadPrivacySettingsBeforeItOpensAStream) {
  ModelSpec spec;
  spec.name = "lenet5";
  auto part = ModelPart::Create(spec, 0, 1);
  ASSERT_TRUE(part.ok());
  Dataset data;
  data.shape = {1, 28, 28};
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (const auto& set : std::vector<std::function<void(v1::SplitTask*)>>{
           [&](v1::SplitTask* st) { st->set_label_epsilon(nan); },
           [&](v1::SplitTask* st) { st->set_label_epsilon(-1); },
           [&](v1::SplitTask* st) { st->set_label_epsilon(51); },
           [&](v1::SplitTask* st) { st->set_activation_noise(inf); },
           [&](v1::SplitTask* st) { st->set_activation_noise(nan); },
           [&](v1::SplitTask* st) { st->set_nopeek(-inf); }}) {
    v1::Task task;
    task.set_round(1);
    v1::SplitTask* st = task.mutable_split();
    st->set_mode("sfl-v2");
    st->set_cut(1);
    st->set_tail_begin(5);
    st->set_num_stages(5);
    st->set_window(1);
    set(st);
    SplitTaskOptions o;
    o.model = spec;
    // No stub: the task must fail before it dials.
    auto r = RunSplitTask(nullptr, v1::Welcome(), task, (*part)->Parameters(), data, o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("bad split privacy settings"), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace cleave
