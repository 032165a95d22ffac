#include "server/run_log.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "core/files.h"

namespace cleave {

Status RunLog::Resume(const std::string& metrics_path, int64_t committed_round) {
  auto text = ReadFile(metrics_path);
  if (!text.ok()) return absl::OkStatus();  // no metrics yet
  std::string kept;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || j.value("round", int64_t{0}) > committed_round) continue;
    if (j.value("evaluation_only", false)) final_evaluated_round_ = j.value("round", int64_t{0});
    if (j.contains("client_eval")) clients_evaluate_ = true;  // for the final evaluation
    kept += line + "\n";
  }
  if (kept.size() == text->size()) return absl::OkStatus();
  spdlog::warn("dropping metrics of rounds after the checkpoint (round {})", committed_round);
  return WriteFileAtomic(metrics_path, kept);
}

void RunLog::Add(const RoundMetrics& m) {
  history_.push_back(m);
  if (m.evaluation_only) {
    final_evaluated_round_ = m.round;
  } else {
    last_accuracy_ = m.test_accuracy;
  }
}

}  // namespace cleave
