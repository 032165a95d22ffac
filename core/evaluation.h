// What a client's evaluation (ClientEvaluation.metrics) may report beside accuracy and
// loss: the metrics cleave's losses compute, each in its range, and names of the client's
// own (a Flower client's evaluate returns any: "f1_macro", "auc"), each an identifier of
// at most 48 bytes with a finite value; at most kMaxEvaluationMetrics of them in all. The
// server refuses anything else; a client whose evaluation is its own code
// (ClientOptions::external) reports what passes and keeps the rest to itself.
#pragma once

#include <cctype>
#include <cmath>
#include <string_view>

namespace cleave {

inline constexpr int kMaxEvaluationMetrics = 16;

// Whether `name` is one of the metrics cleave computes, each of which has a range.
inline bool KnownEvaluationMetric(std::string_view name) {
  return name == "top5_accuracy" || name == "precision" || name == "recall" || name == "f1" ||
         name == "perplexity" || name == "bits_per_byte" || name == "tokens" || name == "mae" || name == "rmse";
}

inline bool ValidEvaluationMetric(std::string_view name, double value) {
  if (!std::isfinite(value)) return false;
  if (!KnownEvaluationMetric(name)) {
    // The client's own: a plain identifier, not one the round's summary writes itself
    // (accuracy, loss and their spread, clients, examples, seconds).
    for (std::string_view taken : {"accuracy", "loss", "clients", "examples", "seconds", "train_seconds"}) {
      if (name.substr(0, taken.size()) == taken) return false;
    }
    if (name.empty() || name.size() > 48 || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_')) {
      return false;
    }
    for (char c : name) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
    }
    return true;
  }
  const bool fraction = name == "top5_accuracy" || name == "precision" || name == "recall" || name == "f1";
  // Text: perplexity is exp(loss) >= 1; bits per byte and tokens counted are >= 0.
  return value >= 0 && !(fraction && value > 1) && !(name == "perplexity" && value < 1);
}

}  // namespace cleave
