// What a client's evaluation (ClientEvaluation.metrics) may report beside accuracy and
// loss: the metrics cleave's losses compute, each in its range. The server refuses any
// other; a client whose evaluation is its own code (ClientOptions::external) reports only
// these and keeps the rest to itself.
#pragma once

#include <cmath>
#include <string_view>

namespace cleave {

inline bool ValidEvaluationMetric(std::string_view name, double value) {
  const bool fraction = name == "top5_accuracy" || name == "precision" || name == "recall" || name == "f1";
  // Text: perplexity is exp(loss) >= 1; bits per byte and tokens counted are >= 0.
  const bool text = name == "perplexity" || name == "bits_per_byte" || name == "tokens";
  return (fraction || text || name == "mae" || name == "rmse") && std::isfinite(value) && value >= 0 &&
         !(fraction && value > 1) && !(name == "perplexity" && value < 1);
}

}  // namespace cleave
