// The rules that combine modules, all in one place (job/job.h). Each refusal names the
// key and says why the combination is unsound.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "job/job.h"
#include "models/kinds.h"

namespace cleave {
namespace {

// The model against the loss, split learning and the server's evaluation.
Status CheckModel(const JobConfig& c) {
  const TrainConfig& t = c.train;
  const ModelTraits kind = ModelTraitsOf(c.model.name);
  RETURN_IF_ERROR(Range(t.loss_path.empty() != ScriptedLoss(t.loss), "train.loss_path",
                        "set exactly when train.loss is torchscript"));
  RETURN_IF_ERROR(Range(t.loss == "cross_entropy" || ScriptedLoss(t.loss) || c.model.classes == 1,
                        "model.classes", "1 with train.loss " + t.loss + " (one output)"));
  if (kind.gpt2 && c.split.enabled()) {
    RETURN_IF_ERROR(Range(!c.model.gpt.tie, "model.gpt.tie",
                          "false with split learning (a tied head shares the embedding's "
                          "weight across the cut)"));
  }
  if (!c.model.personal.empty()) {
    RETURN_IF_ERROR(Range(!c.split.enabled(), "model.personal",
                          "empty with split learning (personal layers are for whole-model "
                          "federated learning)"));
    RETURN_IF_ERROR(Range(!c.server.evaluate, "model.personal",
                          "used without server-side evaluation: the server holds no client's "
                          "personal layers (set data.test: \"\" or server.evaluate: false and "
                          "measure with federated evaluation, local.holdout)"));
  }
  if (kind.has_private_tensors()) {
    RETURN_IF_ERROR(Range(!c.server.evaluate, "model.name interop",
                          "used without server-side evaluation: the server holds no device's base "
                          "(set data.test: \"\" or server.evaluate: false and measure with federated "
                          "evaluation, local.holdout)"));
    const auto no = [](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.name interop (devices' own bases) does not combine with ", what, " yet"));
    };
    // Split learning: the device's base and fusion are its part (U-shaped, with the
    // block's last stages as its tail), the rest of the block the server's; a pipeline
    // would run a device's base on other devices, and a cut elsewhere would split a base
    // or the block.
    if (c.split.Is(SplitMode::kPipeline)) {
      return no("split.mode pipeline (a chain's other devices would hold the data owner's own base)");
    }
    RETURN_IF_ERROR(Range(!c.split.enabled() || c.split.cut == 2, "split.cut",
                          "2 with model.name interop (the device's base and fusion; the server's part is the "
                          "shared block)"));
    if (c.width.enabled) return no("width");
    if (c.scheduler.mode == "gossip") return no("scheduler.mode: gossip (peers exchange whole models)");
  }
  return absl::OkStatus();
}

// Split learning against the strategy and the loss.
Status CheckSplit(const JobConfig& c) {
  if (c.split.enabled()) {
    // A split round's mean model enters the strategy as one update, so any server rule
    // applies; FedProx's term is a client-side loss the split parts do not train with.
    if (c.strategy.name == "fedprox") {
      return absl::InvalidArgumentError(
          "strategy.name: fedprox is not supported with split learning (its proximal term "
          "is not applied to the parts of a cut model)");
    }
    RETURN_IF_ERROR(Range(c.train.loss == "cross_entropy", "train.loss",
                          "cross_entropy with split learning (the server computes the loss "
                          "from labels it receives as integers)"));
  }
  if (c.split.Is(SplitMode::kPipeline)) {
    RETURN_IF_ERROR(Range(c.train.batch_size % c.split.micro_batches == 0, "split.micro_batches",
                          "a divisor of train.batch_size (micro-batches are equal)"));
    RETURN_IF_ERROR(Range(c.split.auto_cut() || c.split.cut >= c.split.devices, "split.cut",
                          "\"auto\" or at least split.devices (each device of a chain holds a stage)"));
    RETURN_IF_ERROR(Range(c.split.micro_batch_tokens == 0 || ModelTraitsOf(c.model.name).tokens(),
                          "split.micro_batch_tokens", "0 unless the model is a language model (gpt, hf)"));
  }
  return absl::OkStatus();
}

// Asynchronous and decentralised rounds against what needs a synchronous round or the
// server's model.
Status CheckScheduler(const JobConfig& c) {
  if (c.scheduler.target_staleness > 0 && !c.scheduler.async()) {
    return absl::InvalidArgumentError(
        "scheduler.target_staleness sizes asynchronous tasks; it needs scheduler.mode: async");
  }
  if (c.scheduler.async()) {
    // Each refusal names what async lacks for the combination to be sound.
    if (c.split.enabled()) {
      return absl::InvalidArgumentError(
          "scheduler.mode: async trains whole models; split.mode runs synchronous rounds");
    }
    if (c.secure_aggregation.enabled) {
      return absl::InvalidArgumentError(
          "scheduler.mode: async and secure_aggregation do not combine (masks are agreed "
          "among a round's clients before they train; an async buffer has no such round)");
    }
    if (c.clients.selection != "uniform") {
      return absl::InvalidArgumentError(
          "scheduler.mode: async hands work to whichever client is idle; clients.selection "
          "must be uniform");
    }
    if (c.aggregation.rule == "fltrust") {
      return absl::InvalidArgumentError(
          "aggregation.rule: fltrust's reference is trained from the buffer's base model, "
          "which async updates do not share; use another rule");
    }
  }
  if (c.scheduler.gossip()) {
    // The server holds no trained model and sees no update: whatever needs either is
    // refused, naming why.
    auto no = [](const std::string& what) {
      return absl::InvalidArgumentError(
          absl::StrCat("scheduler.mode: gossip: ", what));
    };
    if (c.split.enabled()) return no("split learning needs the server's part of the model");
    if (c.secure_aggregation.enabled || c.dp.enabled || c.aggregation.rule != "mean") {
      return no("secure_aggregation, dp and aggregation.rule act on the updates the server "
                "aggregates; in gossip rounds it aggregates none");
    }
    if (c.strategy.name != "fedavg") {
      return no("the server applies no strategy (clients average with their neighbours); "
                "strategy.name must be fedavg");
    }
    auto uncompressed = [](const std::string& spec) { return spec == "none" || spec == "fp32"; };
    if (!uncompressed(c.compression.update) || !uncompressed(c.compression.broadcast)) {
      return no("models travel between peers in fp32; drop compression.update and broadcast");
    }
    if (c.clients.selection != "uniform") return no("clients.selection must be uniform");
    if (!c.model.personal.empty() || c.model.lora.enabled()) {
      return no("personal layers and LoRA are not exchanged between peers yet");
    }
    if (c.server.evaluate) {
      return no("the server holds no trained model to evaluate; set server.evaluate: false "
                "and measure on the clients' held-out data (local.holdout)");
    }
  }
  return absl::OkStatus();
}

// Privacy and robustness (DP, secure aggregation, robust rules, Oort, EF21) against each
// other and against split learning.
Status CheckPrivacy(const JobConfig& c) {
  if (c.dp.enabled && c.dp.noise == "distributed") {
    if (!c.secure_aggregation.enabled) {
      return absl::InvalidArgumentError(
          "dp.noise: distributed noise needs secure_aggregation (each share alone is too weak)");
    }
    if (c.dp.adaptive) {
      return absl::InvalidArgumentError(
          "dp.adaptive: adaptive clipping needs the clients' norms; use dp.noise: central");
    }
  }
  if (c.clients.selection == "oort" && c.split.enabled()) {
    return absl::InvalidArgumentError(
        "clients.selection: oort picks clients for federated rounds; split.mode assigns its own");
  }
  if (c.clients.selection == "oort" && c.dp.enabled) {
    return absl::InvalidArgumentError(
        "clients.selection: oort and dp do not combine (the privacy accounting assumes "
        "uniformly sampled clients)");
  }
  if (c.dp.enabled && c.aggregation.rule != "mean") {
    return absl::InvalidArgumentError(
        "aggregation.rule: a robust rule and dp do not combine (dp averages clipped updates)");
  }
  if (c.secure_aggregation.enabled && c.aggregation.rule != "mean") {
    return absl::InvalidArgumentError(
        "aggregation.rule: robust rules need individual updates, which secure aggregation hides");
  }
  if (c.secure_aggregation.enabled && c.dp.enabled && c.dp.noise == "central") {
    return absl::InvalidArgumentError(
        "dp.noise: with secure aggregation the server cannot clip updates; use distributed");
  }
  if ((c.dp.enabled || c.aggregation.rule != "mean") && c.split.enabled()) {
    return absl::InvalidArgumentError("dp and aggregation.rule apply to federated rounds, not split");
  }
  if (absl::EndsWith(c.compression.update, ":ef21")) {
    if (c.dp.enabled || c.aggregation.rule != "mean") {
      return absl::InvalidArgumentError(
          "compression.update: EF21 uploads increments of an estimate, not updates, which dp "
          "and robust rules need; use topk without :ef21");
    }
    if (c.split.enabled()) {
      return absl::InvalidArgumentError(
          "compression.update: :ef21 applies to federated rounds, not split learning");
    }
    if (c.scheduler.async()) {
      return absl::InvalidArgumentError(
          "compression.update: EF21's server estimate is the sum of every client's, which "
          "staleness-scaled async updates do not keep; use topk without :ef21");
    }
  }
  if (c.secure_aggregation.enabled) {
    if (c.split.enabled() && !c.split.Is(SplitMode::kPipeline)) {
      return absl::InvalidArgumentError(
          "secure_aggregation: of split learning's modes only split.mode: pipeline masks the devices' "
          "parts (split.devices: 1 trains as sfl-v1 does)");
    }
    if (c.compression.update != "none") {
      return absl::InvalidArgumentError(
          "secure_aggregation: the update travels quantized and masked; drop compression.update");
    }
  }
  return absl::OkStatus();
}

// Width-scaled submodels (section width) against what they do not combine with yet.
Status CheckWidth(const JobConfig& c) {
  if (!c.width.enabled) return absl::OkStatus();
  const ModelTraits kind = ModelTraitsOf(c.model.name);
  const WidthConfig& w = c.width;
  if (w.ranks()) {
    RETURN_IF_ERROR(Range(kind.tokens() && c.model.lora.enabled(), "width.method",
                          "hetlora or flexlora used with model.lora on model.name gpt or hf"));
    // Every rate must name a whole rank of model.lora.rank.
    const int rank = c.model.lora.rank;
    std::vector<std::pair<std::string, double>> rates = {{"width.rate", w.rate}};
    for (const WidthConfig::Client& client : w.clients) rates.emplace_back("width.clients[].rate", client.rate);
    if (w.assign == "profile") {
      for (double r : w.rates) rates.emplace_back("width.rates", r);
    }
    for (const auto& [key, rate] : rates) {
      const double r = rate * rank;
      RETURN_IF_ERROR(Range(std::abs(r - std::round(r)) < 1e-9 && std::round(r) >= 1, key,
                            absl::StrCat("a whole fraction k / ", rank, " of model.lora.rank (", rate, " gives rank ",
                                         r, ")")));
    }
  } else {
    RETURN_IF_ERROR(Range(kind.scales, "width",
                          "used with model.name mlp, lenet5, cnn, resnet, gpt or hf (LoRA ranks of gpt or hf: "
                          "width.method hetlora or flexlora)"));
    RETURN_IF_ERROR(Range(!c.model.lora.enabled(), "width",
                          "used on LoRA adapters with width.method hetlora or flexlora (per-device ranks)"));
    RETURN_IF_ERROR(Range(!kind.tokens() || w.distill.data.empty(), "width.distill",
                          "used with image and table models (FedDF distils class logits)"));
    // A submodel's running statistics are not the whole model's (HeteroFL's static
    // batch normalization keeps none).
    RETURN_IF_ERROR(Range(!kind.batch_norm || c.model.batch_norm == "static", "width",
                          "used on resnet with model.batch_norm: static (a submodel's running statistics "
                          "are not the whole model's)"));
  }
  const auto no = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("width: submodels do not combine with ", what, " yet"));
  };
  if (c.split.enabled()) return no("split learning");
  if (c.scheduler.gossip()) return no("scheduler.mode: gossip (peers exchange whole models)");
  if (c.scheduler.async() && (w.ranks() || c.dp.enabled || !w.distill.data.empty())) {
    return no("scheduler.mode: async with LoRA ranks, dp or width.distill (async buffers take heterofl and "
              "fedrolex submodels)");
  }
  if (c.secure_aggregation.enabled && (w.ranks() || !w.distill.data.empty())) {
    return no("secure_aggregation with LoRA ranks or width.distill (they need each device's own update)");
  }
  if (c.secure_aggregation.enabled && c.dp.enabled) {
    return no("dp under secure_aggregation (distributed noise on slices held by different devices)");
  }
  if (c.dp.enabled && w.ranks()) return no("dp on LoRA ranks (dp applies to width.method heterofl and fedrolex)");
  if (c.dp.enabled && !w.distill.data.empty()) {
    return no("dp and width.distill (FedDF distils the devices' own models, which DP-FedAvg never releases)");
  }
  const std::string& rule = c.aggregation.rule;
  if (rule != "mean" && (w.ranks() || (rule != "median" && rule != "trimmed_mean" && rule != "norm_bound"))) {
    return no(absl::StrCat("aggregation.rule ", rule, w.ranks() ? " on LoRA ranks"
                                                              : " (it compares whole updates; median, trimmed_mean "
                                                                "and norm_bound apply per element)"));
  }
  // A device's window is fixed but for FedRolex's, so a client's error-feedback memory
  // stays in place; EF21's server estimate is a sum of every client's full-model estimate.
  if (c.compression.update != "none" && w.method == "fedrolex") {
    return no("compression.update with width.method fedrolex (error feedback would mix rolled windows)");
  }
  if (absl::EndsWith(c.compression.update, ":ef21")) return no("compression.update :ef21");
  if (!c.model.personal.empty()) return no("model.personal");
  return absl::OkStatus();
}

}  // namespace

Status CheckCombinations(const JobConfig& c) {
  RETURN_IF_ERROR(CheckWidth(c));
  RETURN_IF_ERROR(CheckModel(c));
  RETURN_IF_ERROR(CheckSplit(c));
  RETURN_IF_ERROR(CheckScheduler(c));
  return CheckPrivacy(c);
}

}  // namespace cleave
