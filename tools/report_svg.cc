#include "tools/report_svg.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cleave::report {

using nlohmann::json;

std::optional<double> Number(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

std::string Short(double v) {
  if (v == 0) return "0";
  return absl::StrFormat("%.4g", v);
}

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                               "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};
const char* Color(size_t run) { return kColors[run % (sizeof(kColors) / sizeof(kColors[0]))]; }

namespace {

// About five round numbers (1, 2 or 5 times a power of ten) covering [lo, hi].
std::vector<double> Ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5   ? mag
                      : raw / mag < 3.5 ? 2 * mag
                      : raw / mag < 7.5 ? 5 * mag
                                        : 10 * mag;
  std::vector<double> ticks;
  // (Counted, not stepped: a step below the values' precision would not advance.)
  const double first = std::ceil(lo / step);
  for (int i = 0; i < 12; ++i) {
    const double t = (first + i) * step;
    if (t > hi + step * 1e-9) break;
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

// A tick's label: enough significant digits to tell it from its neighbours `step` away
// (at least six, so round values print plainly), where Short's four would print 3.572 for
// every tick of values that move by 1e-5.
std::string TickLabel(double t, double step) {
  if (t == 0) return "0";
  const int digits =
      static_cast<int>(std::floor(std::log10(std::abs(t))) - std::floor(std::log10(step))) + 1;
  return absl::StrFormat("%.*g", std::clamp(digits, 6, 17), t);
}

}  // namespace

std::string Svg(const Chart& chart) {
  constexpr double kW = 600, kH = 300, kLeft = 64, kRight = 16, kTop = 14, kBottom = 44;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  auto extend = [&](const Points& points) {
    for (auto [x, y] : points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  };
  for (const Line& l : chart.lines) extend(l.points);
  for (const Band& b : chart.bands) extend(b.lower), extend(b.upper);
  if (x1 <= x0) x0 -= 0.5, x1 += 0.5;
  if (y1 <= y0) y0 -= std::max(0.5, std::abs(y0) * 0.1), y1 += std::max(0.5, std::abs(y1) * 0.1);
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * (kW - kLeft - kRight); };
  auto py = [&](double y) { return kTop + (y1 - y) / (y1 - y0) * (kH - kTop - kBottom); };
  auto path = [&](const Points& points) {
    std::string s;
    for (auto [x, y] : points)
      absl::StrAppend(&s, s.empty() ? "" : " ", absl::StrFormat("%.1f,%.1f", px(x), py(y)));
    return s;
  };

  std::string svg = absl::StrFormat(
      "<svg class=\"chart\" viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" role=\"img\" "
      "aria-label=\"%s\">\n",
      kW, kH, kW, kH, HtmlEscape(chart.title));
  const std::vector<double> y_ticks = Ticks(y0, y1), x_ticks = Ticks(x0, x1);
  auto step = [](const std::vector<double>& ticks) {
    return ticks.size() > 1 ? ticks[1] - ticks[0] : 1.0;
  };
  for (double t : y_ticks) {
    absl::StrAppend(
        &svg,
        absl::StrFormat("<line class=\"grid\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>"
                        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                        kLeft, kW - kRight, py(t), py(t), kLeft - 6, py(t) + 4,
                        TickLabel(t, step(y_ticks))));
  }
  for (double t : x_ticks) {
    absl::StrAppend(
        &svg,
        absl::StrFormat("<line class=\"tick\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>"
                        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                        px(t), px(t), kH - kBottom, kH - kBottom + 5, px(t), kH - kBottom + 18,
                        TickLabel(t, step(x_ticks))));
  }
  absl::StrAppend(
      &svg,
      absl::StrFormat(
          "<line class=\"axis\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>\n"
          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n"
          "<text transform=\"translate(14 %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
          kLeft, kW - kRight, kH - kBottom, kH - kBottom, (kLeft + kW - kRight) / 2, kH - 6,
          HtmlEscape(chart.x_label), (kTop + kH - kBottom) / 2, HtmlEscape(chart.y_label)));
  for (const Band& b : chart.bands) {
    Points outline = b.lower;
    outline.insert(outline.end(), b.upper.rbegin(), b.upper.rend());
    absl::StrAppend(&svg, absl::StrFormat("<polygon class=\"band\" fill=\"%s\" points=\"%s\"/>\n",
                                          Color(b.run), path(outline)));
  }
  for (const Line& l : chart.lines) {
    if (l.points.empty()) continue;
    absl::StrAppend(&svg,
                    absl::StrFormat("<polyline class=\"series\" stroke=\"%s\" points=\"%s\"/>\n",
                                    Color(l.run), path(l.points)));
    if (l.points.size() <= 40) {
      for (auto [x, y] : l.points) {
        absl::StrAppend(&svg, absl::StrFormat("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" "
                                              "fill=\"%s\"><title>%s, %s</title></circle>\n",
                                              px(x), py(y), Color(l.run), Short(x), Short(y)));
      }
    }
  }
  return svg + "</svg>\n";
}

std::string StepBreakdown(const std::vector<RunRecord>& runs) {
  struct Parts {
    size_t run;
    double client = 0, transfer = 0, server = 0;
  };
  std::vector<Parts> bars;
  for (size_t i = 0; i < runs.size(); ++i) {
    Parts p{i};
    int n = 0;
    for (const json& row : runs[i].rounds) {
      auto c = Number(row, "client_compute_s"), t = Number(row, "transfer_s"),
           s = Number(row, "server_compute_s");
      if (!c || !t || !s) continue;
      p.client += *c, p.transfer += *t, p.server += *s, ++n;
    }
    if (n == 0) continue;
    p.client /= n, p.transfer /= n, p.server /= n;
    bars.push_back(p);
  }
  if (bars.empty()) return "";
  double longest = 0;
  for (const Parts& p : bars) longest = std::max(longest, p.client + p.transfer + p.server);
  if (longest <= 0) longest = 1;
  constexpr double kW = 600, kLeft = 160, kRight = 90, kBar = 22, kGap = 10;
  const double height = bars.size() * (kBar + kGap) + 30;
  std::string svg = absl::StrFormat(
      "<svg class=\"chart\" viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" role=\"img\" "
      "aria-label=\"split step time\">\n",
      kW, height, kW, height);
  const char* const part_colors[] = {"#1f77b4", "#bbbbbb", "#ff7f0e"};
  for (size_t b = 0; b < bars.size(); ++b) {
    const double y = b * (kBar + kGap);
    double x = kLeft;
    const double parts[] = {bars[b].client, bars[b].transfer, bars[b].server};
    absl::StrAppend(&svg,
                    absl::StrFormat("<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                                    kLeft - 6, y + kBar * 0.7, HtmlEscape(runs[bars[b].run].name)));
    for (int k = 0; k < 3; ++k) {
      const double w = parts[k] / longest * (kW - kLeft - kRight);
      absl::StrAppend(&svg,
                      absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.0f\" "
                                      "fill=\"%s\"><title>%.2f ms</title></rect>\n",
                                      x, y, w, kBar, part_colors[k], 1e3 * parts[k]));
      x += w;
    }
    absl::StrAppend(&svg, absl::StrFormat("<text x=\"%.1f\" y=\"%.1f\">%.1f ms</text>\n", x + 4,
                                          y + kBar * 0.7, 1e3 * (parts[0] + parts[1] + parts[2])));
  }
  const double ly = height - 10;
  const char* const names[] = {"client compute", "transfer", "server compute"};
  for (int k = 0; k < 3; ++k) {
    absl::StrAppend(&svg, absl::StrFormat("<rect x=\"%.0f\" y=\"%.0f\" width=\"10\" height=\"10\" "
                                          "fill=\"%s\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                                          kLeft + k * 130, ly - 9, part_colors[k],
                                          kLeft + k * 130 + 14, ly, names[k]));
  }
  return svg + "</svg>\n";
}

namespace {

// One pipeline chain's timeline (metrics.jsonl's "pipeline" entry): a row per device with
// the share of its task it computed, a bar per pass; "" when the entry is malformed.
std::string ChainTimeline(const json& chain) {
  if (!chain.is_object() || !chain.contains("devices") || !chain["devices"].is_array() ||
      !chain.contains("spans") || !chain["spans"].is_array()) {
    return "";
  }
  const json& devices = chain["devices"];
  const json& spans = chain["spans"];
  // A span: [device, micro-batch, "F" or "B", start, end], of a device of the chain.
  auto well_formed = [&](const json& x) {
    return x.is_array() && x.size() == 5 && x[0].is_number_integer() && x[1].is_number_integer() &&
           x[3].is_number() && x[4].is_number() && x[0].get<int64_t>() >= 0 &&
           x[0].get<int64_t>() < static_cast<int64_t>(devices.size());
  };
  double end = 0;
  for (const json& x : spans) {
    if (well_formed(x)) end = std::max(end, x[4].get<double>());
  }
  if (devices.empty() || end <= 0) return "";
  constexpr double kW = 720, kLeft = 150, kRight = 20, kRow = 22, kGap = 6;
  const double height = devices.size() * (kRow + kGap) + 24;
  const double scale = (kW - kLeft - kRight) / end;
  std::string svg = absl::StrFormat(
      "<svg class=\"chart\" viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" "
      "role=\"img\" aria-label=\"pipeline timeline\">\n",
      kW, height, kW, height);
  const json& shares = chain.contains("busy") ? chain["busy"] : json::array();
  for (size_t d = 0; d < devices.size(); ++d) {
    const double y = d * (kRow + kGap);
    const double busy = shares.is_array() && d < shares.size() && shares[d].is_number()
                            ? shares[d].get<double>()
                            : 0;
    absl::StrAppend(
        &svg,
        absl::StrFormat("<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%s (%.0f%%)</text>\n",
                        kLeft - 6, y + kRow * 0.7,
                        HtmlEscape(devices[d].is_string() ? devices[d].get<std::string>() : "?"),
                        100 * busy));
  }
  for (const json& x : spans) {
    if (!well_formed(x)) continue;
    const int d = x[0].get<int>();
    const bool forward = x[2] == "F";
    const double start = x[3].get<double>(), stop = x[4].get<double>();
    const double x0 = kLeft + start * scale, w = std::max(1.0, (stop - start) * scale);
    const double y = d * (kRow + kGap);
    absl::StrAppend(&svg,
                    absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.0f\" "
                                    "fill=\"%s\"><title>%s %d: %.2f ms</title></rect>"
                                    "<text x=\"%.1f\" y=\"%.1f\" fill=\"#fff\">%d</text>\n",
                                    x0, y, w, kRow, forward ? "#1f77b4" : "#ff7f0e",
                                    forward ? "forward" : "backward", x[1].get<int>(),
                                    1e3 * (stop - start), x0 + 2, y + kRow * 0.7, x[1].get<int>()));
  }
  absl::StrAppend(
      &svg, absl::StrFormat("<text x=\"%.0f\" y=\"%.0f\">0</text>"
                            "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.1f ms</text>\n",
                            kLeft, height - 6, kW - kRight, height - 6, 1e3 * end));
  return svg;
}

}  // namespace

std::string PipelineTimelines(const std::vector<RunRecord>& runs) {
  std::string out;
  for (const RunRecord& run : runs) {
    const json* last = nullptr;
    for (const json& row : run.rounds) {
      if (row.contains("pipeline") && row["pipeline"].is_array() && !row["pipeline"].empty()) {
        last = &row;
      }
    }
    if (last == nullptr) continue;
    for (size_t c = 0; c < (*last)["pipeline"].size(); ++c) {
      const json& chain = (*last)["pipeline"][c];
      const std::string svg = ChainTimeline(chain);
      if (svg.empty()) continue;
      absl::StrAppend(&out, "<figure><figcaption>", HtmlEscape(run.name), ": pipeline chain ", c,
                      " (round ", Number(*last, "round").value_or(0), "), bubble ",
                      absl::StrFormat("%.0f%%", 100 * Number(chain, "bubble").value_or(0)),
                      "</figcaption>\n", svg,
                      "</svg><p class=\"note\">Each device's passes over its first batch: forward "
                      "(blue) and backward (orange) of each micro-batch; in brackets the share of "
                      "its task it computed. The server's passes are not drawn.</p></figure>\n");
    }
  }
  return out;
}

}  // namespace cleave::report
