// What a device may be sent to train with (CheckFit): settings from a server or a
// strategy that no trainer can use are refused naming the field, before anything
// divides by a batch of 0.
#include "core/fit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

namespace cleave {
namespace {

TEST(CheckFitTest, RefusesSettingsNoTrainerCanUse) {
  EXPECT_TRUE(CheckFit(FitSettings{}, "task").ok());
  FitSettings steps;
  steps.local_epochs = 0;
  steps.local_steps = 5;
  EXPECT_TRUE(CheckFit(steps, "task").ok());  // steps instead of epochs
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::function<void(FitSettings&)> change;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](FitSettings& f) { f.batch_size = 0; }, "batch_size"},
      {[](FitSettings& f) { f.batch_size = -3; }, "batch_size"},
      {[](FitSettings& f) { f.local_epochs = 0; }, "local_epochs"},
      {[](FitSettings& f) { f.local_steps = -1; }, "local_steps"},
      {[&](FitSettings& f) { f.lr = nan; }, "lr"},
      {[&](FitSettings& f) { f.lr = -0.1; }, "lr"},
      {[&](FitSettings& f) { f.momentum = 1; }, "momentum"},
      {[&](FitSettings& f) { f.weight_decay = inf; }, "weight_decay"},
      {[&](FitSettings& f) { f.clip_norm = nan; }, "clip_norm"},
      {[&](FitSettings& f) { f.label_smoothing = 1; }, "label_smoothing"},
      {[&](FitSettings& f) { f.proximal_mu = -1; }, "proximal_mu"},
  };
  for (const Case& c : cases) {
    FitSettings f;
    c.change(f);
    const Status s = CheckFit(f, "configure_fit's config for c1");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find("configure_fit's config for c1: " + c.field + " must be"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace cleave
