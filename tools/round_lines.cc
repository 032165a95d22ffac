#include "tools/round_lines.h"

#include <ctime>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cleave {

std::string Bytes(double b) {
  if (b >= 1e9) return absl::StrFormat("%.2f GB", b / 1e9);
  if (b >= 1e6) return absl::StrFormat("%.1f MB", b / 1e6);
  if (b >= 1e3) return absl::StrFormat("%.1f kB", b / 1e3);
  return absl::StrFormat("%.0f B", b);
}

std::string AccuracyText(const nlohmann::json& j) {
  if (j.contains("test_perplexity")) {
    return absl::StrFormat("test ppl %.3f  bits/byte %.3f", j.value("test_perplexity", 0.0),
                           j.value("test_bits_per_byte", 0.0));
  }
  if (j.contains("test_rmse")) {
    return absl::StrFormat("test rmse %.4f  test mae %.4f", j.value("test_rmse", 0.0),
                           j.value("test_mae", 0.0));
  }
  if (j.contains("client_eval") && j["client_eval"].contains("rmse")) {
    const auto& e = j["client_eval"];
    return absl::StrFormat("client rmse %.4f (loss min %.4f, max %.4f)", e.value("rmse", 0.0),
                           e.value("loss_min", 0.0), e.value("loss_max", 0.0));
  }
  if (j.contains("test_accuracy")) {
    return absl::StrFormat("test acc %6.2f%%  test loss %.4f", 100 * j.value("test_accuracy", 0.0),
                           j.value("test_loss", 0.0));
  }
  if (j.contains("client_eval")) {
    const auto& e = j["client_eval"];
    return absl::StrFormat("client acc %6.2f%% (min %.2f%%, max %.2f%%)",
                           100 * e.value("accuracy", 0.0), 100 * e.value("accuracy_min", 0.0),
                           100 * e.value("accuracy_max", 0.0));
  }
  return "no evaluation";
}

std::string Timestamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

void RoundPrinter::Drain() {
  if (!metrics_.is_open()) {
    metrics_.open(run_dir_ + "/metrics.jsonl");
    if (!metrics_.is_open()) return;
  }
  std::string line;
  while (std::getline(metrics_, line)) {
    if (metrics_.eof()) {  // incomplete last line: keep it for the next read
      partial_ += line;
      metrics_.clear();
      return;
    }
    line = partial_ + line;
    partial_.clear();
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;
    last_ = j;
    total_up_ += j.value("bytes_up", int64_t{0});
    total_down_ += j.value("bytes_down", int64_t{0});
    if (j.value("evaluation_only", false)) {
      std::cout << absl::StrFormat("final model  %s  (%d clients evaluated it, %d failed)\n",
                                   AccuracyText(j), j.value("participants", 0),
                                   j.value("failures", 0))
                << std::flush;
      continue;
    }
    std::cout << absl::StrFormat(
                     "round %3d/%d  %s  train loss %.4f  up %9s  down %9s  %6.1fs  "
                     "(%d clients, %d failed)",
                     j.value("round", 0), rounds_, AccuracyText(j), j.value("train_loss", 0.0),
                     Bytes(j.value("bytes_up", 0.0)), Bytes(j.value("bytes_down", 0.0)),
                     j.value("wall_s", 0.0), j.value("participants", 0),
                     j.value("failures", 0));
    if (j.contains("staleness_max")) {  // an async buffer
      std::cout << absl::StrFormat("  staleness mean %.2f max %d", j.value("staleness_mean", 0.0),
                                   j.value("staleness_max", 0));
      const auto& steps = j.value("local_steps", nlohmann::json::object());
      if (steps.value("min", 0) != steps.value("max", 0)) {  // sized per client
        std::cout << absl::StrFormat("  steps %d-%d", steps.value("min", 0), steps.value("max", 0));
      }
    }
    if (j.contains("epsilon")) {
      std::cout << absl::StrFormat("  eps %.3f", j.value("epsilon", 0.0));
    }
    if (j.contains("cuts")) {
      std::string cuts;
      for (const auto& [client, cut] : j["cuts"].items()) {
        absl::StrAppend(&cuts, cuts.empty() ? "" : ",", cut.get<int>());
      }
      std::cout << absl::StrFormat("  cuts [%s] step %.1f ms", cuts,
                                   1e3 * j.value("step_s", 0.0));
    }
    std::cout << "\n" << std::flush;
  }
  metrics_.clear();
}

}  // namespace cleave
