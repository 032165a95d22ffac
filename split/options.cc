#include "split/options.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "split/names.h"

namespace cleave {

void ReadSplit(ConfigSection& s, SplitConfig& c) {
  s.Read("mode", c.mode);
  std::string cut = c.auto_cut() ? "auto" : absl::StrCat(c.cut);
  s.Read("cut", cut);
  if (cut == "auto") {
    c.cut = 0;
  } else if (!absl::SimpleAtoi(cut, &c.cut) || c.cut < 1) {
    s.Reject("cut", "\"auto\" or a stage index >= 1");
  }
  s.Read("tail", c.tail);
  s.Read("window", c.window);
  s.Read("activation_noise", c.activation_noise);
  s.Read("nopeek", c.nopeek);
  s.Read("label_epsilon", c.label_epsilon);
  s.Read("devices", c.devices);
  s.Read("micro_batches", c.micro_batches);
  s.Read("micro_batch_tokens", c.micro_batch_tokens);
  s.Read("schedule", c.schedule);
  s.Read("plan", c.plan);
  s.Read("ushaped", c.ushaped);
  s.Read("record", c.record);
  s.Read("hijack", c.hijack);
  s.Read("max_reconstruction_ssim", c.max_reconstruction_ssim);
  s.Read("max_token_recovery", c.max_token_recovery);
}

Status CheckSplit(SplitConfig& c) {
  RETURN_IF_ERROR(Range(c.activation_noise >= 0, "split.activation_noise", ">= 0"));
  RETURN_IF_ERROR(Range(c.nopeek >= 0, "split.nopeek", ">= 0"));
  RETURN_IF_ERROR(Range(c.label_epsilon >= 0 && c.label_epsilon <= 50, "split.label_epsilon", "in [0, 50]"));
  RETURN_IF_ERROR(Range(c.record >= 0 && c.record <= 1000, "split.record", "in [0, 1000]"));
  RETURN_IF_ERROR(Range(c.cut >= 0, "split.cut", "\"auto\" (0) or a stage index >= 1"));
  RETURN_IF_ERROR(Range(c.max_reconstruction_ssim >= 0 && c.max_reconstruction_ssim <= 1,
                        "split.max_reconstruction_ssim", "in [0, 1]"));
  RETURN_IF_ERROR(Range(c.max_token_recovery >= 0 && c.max_token_recovery <= 1, "split.max_token_recovery", "in [0, 1]"));
  if (c.max_reconstruction_ssim > 0 && c.max_token_recovery > 0) {
    return absl::InvalidArgumentError("split.max_reconstruction_ssim (images) and split.max_token_recovery (a decoder): "
                                      "set the one for the model");
  }
  for (const auto& [key, floor] : {std::pair<const char*, double>{"split.max_reconstruction_ssim", c.max_reconstruction_ssim},
                                   {"split.max_token_recovery", c.max_token_recovery}}) {
    if (floor > 0 && (!c.auto_cut() || c.Is(SplitMode::kPipeline))) {
      return absl::InvalidArgumentError(absl::StrCat(
          key, " is a floor for the automatic cut: it needs split.cut: auto, and not a pipeline"));
    }
  }
  RETURN_IF_ERROR(Range(c.hijack.empty() || c.hijack == "fsha", "split.hijack", "\"\" or fsha"));
  if (!c.hijack.empty() &&
      (c.auto_cut() || !(c.Is(SplitMode::kSl) || c.Is(SplitMode::kSflV1) || c.Is(SplitMode::kSflV2)))) {
    return absl::InvalidArgumentError(
        "split.hijack hijacks the client part at a fixed split.cut, in split.mode sl, sfl-v1 or sfl-v2");
  }
  if (!c.enabled()) return absl::OkStatus();
  RETURN_IF_ERROR(SplitModeNames().Check(c.mode));
  RETURN_IF_ERROR(Range(c.tail >= 1, "split.tail", ">= 1"));
  RETURN_IF_ERROR(Range(c.micro_batch_tokens >= 0, "split.micro_batch_tokens", ">= 0"));
  if (c.micro_batch_tokens > 0 && !c.Is(SplitMode::kPipeline)) {
    return absl::InvalidArgumentError("split.micro_batch_tokens applies to split.mode: pipeline");
  }
  if (c.ushaped && !c.Is(SplitMode::kPipeline)) {
    return absl::InvalidArgumentError("split.ushaped applies to split.mode: pipeline (mode ushaped is U-shaped already)");
  }
  if (c.Is(SplitMode::kPipeline)) {
    RETURN_IF_ERROR(Range(c.devices >= 1 && c.devices <= 16, "split.devices", "in [1, 16]"));
    RETURN_IF_ERROR(Range(c.micro_batches >= 1 && c.micro_batches <= 64, "split.micro_batches", "in [1, 64]"));
    RETURN_IF_ERROR(Range(c.schedule == "gpipe" || c.schedule == "1f1b", "split.schedule", "gpipe or 1f1b"));
    RETURN_IF_ERROR(Range(c.plan == "auto" || (c.plan == "even" && !c.auto_cut()), "split.plan",
                          "auto, or even with a fixed split.cut"));
  }
  return Range(c.window >= 1 && c.window <= 64, "split.window", "in [1, 64]");
}

}  // namespace cleave
