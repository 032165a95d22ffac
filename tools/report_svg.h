// The report's drawing: HTML escaping, the run colours, and the SVG charts (series
// against an x axis, split learning's step breakdown, pipeline timelines). Internal to
// tools/report.cc.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/printable.h"
#include "tools/report.h"

namespace cleave::report {

// j[key] when it is a number.
std::optional<double> Number(const nlohmann::json& j, const char* key);
// Axis ticks and table cells: 4 significant digits.
std::string Short(double v);
// Run `run`'s colour in every chart and table.
const char* Color(size_t run);

using Points = std::vector<std::pair<double, double>>;
struct Line {
  size_t run;
  Points points;
};
struct Band {  // a shaded range between two curves of one run, at the same x
  size_t run;
  Points lower, upper;
};
struct Chart {
  std::string title, x_label, y_label, caption;
  std::vector<Line> lines;
  std::vector<Band> bands;
  bool empty() const {
    for (const Line& l : lines) {
      if (!l.points.empty()) return false;
    }
    return true;
  }
};
std::string Svg(const Chart& chart);

// Split learning: each run's mean step time, split into its parts, as stacked bars ("" when
// no run has split times).
std::string StepBreakdown(const std::vector<RunRecord>& runs);
// split.mode: pipeline: each chain's timeline in the last round that has one, a row per
// device and a bar per pass over its first batch (forward blue, backward orange,
// labelled with its micro-batch); the gaps are the pipeline's bubbles and transfers.
std::string PipelineTimelines(const std::vector<RunRecord>& runs);

}  // namespace cleave::report
