#include "tools/report.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/files.h"
#include "tools/report_svg.h"
#include "tools/round_lines.h"

namespace cleave {
namespace {

using nlohmann::json;
using report::Band;
using report::Chart;
using report::Color;
using report::Line;
using report::Number;
using report::PipelineTimelines;
using report::Short;
using report::StepBreakdown;
using report::Svg;
namespace fs = std::filesystem;

std::optional<double> ClientEval(const json& row, const char* key) {
  auto it = row.find("client_eval");
  if (it == row.end() || !it->is_object()) return std::nullopt;
  return Number(*it, key);
}

// The number a run is judged by, chosen from its first round as AccuracyText does.
struct Headline {
  std::string name;
  bool higher_is_better = true;
  std::function<std::optional<double>(const json&)> get;
};

Headline HeadlineOf(const RunRecord& run) {
  const json first = run.rounds.empty() ? json::object() : run.rounds.front();
  auto test = [](const char* key) {
    return [key](const json& r) { return Number(r, key); };
  };
  auto client = [](const char* key) {
    return [key](const json& r) { return ClientEval(r, key); };
  };
  if (first.contains("test_perplexity")) return {"test perplexity", false, test("test_perplexity")};
  if (first.contains("test_rmse")) return {"test RMSE", false, test("test_rmse")};
  if (ClientEval(first, "rmse")) return {"client RMSE", false, client("rmse")};
  if (first.contains("test_accuracy")) return {"test accuracy", true, test("test_accuracy")};
  if (ClientEval(first, "accuracy")) return {"client accuracy", true, client("accuracy")};
  return {"", true, [](const json&) { return std::nullopt; }};
}

std::optional<double> Loss(const json& row) {
  if (auto l = Number(row, "test_loss")) return l;
  return ClientEval(row, "loss");
}

std::string Duration(double s) {
  if (s >= 3600) return absl::StrFormat("%.1f h", s / 3600);
  if (s >= 120) return absl::StrFormat("%.1f min", s / 60);
  return absl::StrFormat("%.1f s", s);
}

// A chart of one value per round for every run that has it; x from `x_of` (which sees
// the rows in order, so it may accumulate).
Chart PerRound(const std::vector<RunRecord>& runs, std::string title, std::string x_label,
               std::string y_label,
               const std::function<std::optional<double>(size_t run, const json& row)>& y_of,
               const std::function<double(const json&, double previous)>& x_of) {
  Chart chart{std::move(title), std::move(x_label), std::move(y_label), "", {}, {}};
  for (size_t i = 0; i < runs.size(); ++i) {
    Line line{i, {}};
    double x = 0;
    for (const json& row : runs[i].rounds) {
      x = x_of(row, x);
      if (auto y = y_of(i, row); y && std::isfinite(*y)) line.points.emplace_back(x, *y);
    }
    chart.lines.push_back(std::move(line));
  }
  return chart;
}

double RoundX(const json& row, double) { return Number(row, "round").value_or(0); }
double ElapsedX(const json& row, double) { return Number(row, "elapsed_s").value_or(0); }
// The server's transport bytes, and in gossip the models the clients sent each other.
double MegabytesX(const json& row, double before) {
  double peer = 0;
  if (auto g = row.find("gossip"); g != row.end() && g->is_object()) peer = Number(*g, "peer_bytes").value_or(0);
  return before + (Number(row, "bytes_up").value_or(0) + Number(row, "bytes_down").value_or(0) + peer) / 1e6;
}

std::function<std::optional<double>(size_t run, const json& row)> Field(const char* key) {
  return [key](size_t, const json& row) { return Number(row, key); };
}

std::string CommonHeadline(const std::vector<Headline>& headlines) {
  std::set<std::string> names;
  for (const Headline& h : headlines) {
    if (!h.name.empty()) names.insert(h.name);
  }
  return names.size() == 1 ? *names.begin() : "the run's metric";
}

std::vector<Chart> Charts(const std::vector<RunRecord>& runs) {
  std::vector<Headline> headlines;
  for (const RunRecord& r : runs) headlines.push_back(HeadlineOf(r));
  const std::string metric = CommonHeadline(headlines);
  auto headline = [&headlines](size_t run, const json& row) { return headlines[run].get(row); };
  std::vector<Chart> charts;
  charts.push_back(PerRound(runs, metric + " against round", "round", metric, headline, RoundX));
  charts.push_back(PerRound(runs, metric + " against wall time", "seconds since the run started",
                            metric, headline, ElapsedX));
  charts.push_back(PerRound(runs, metric + " against bytes", "MB on the wire (up + down + peer to peer, cumulative)",
                            metric, headline, MegabytesX));
  charts.push_back(PerRound(runs, "Loss against round", "round", "test loss (else clients' held-out loss)",
                            [](size_t, const json& r) { return Loss(r); }, RoundX));
  charts.push_back(PerRound(runs, "Training loss against round", "round",
                            "clients' last-epoch loss", Field("train_loss"), RoundX));
  charts.push_back(PerRound(runs, "Round time", "round", "seconds (sampling to commit)",
                            Field("wall_s"), RoundX));
  charts.push_back(PerRound(runs, "Bytes per round", "round", "MB (up + down + peer to peer)",
                            [](size_t, const json& r) -> std::optional<double> {
                              return MegabytesX(r, 0);
                            },
                            RoundX));

  // The clients' spread: the median of their held-out accuracy, between min and max.
  Chart spread = PerRound(runs, "Accuracy per client", "round",
                          "held-out accuracy (median; min to max shaded)",
                          [](size_t, const json& r) { return ClientEval(r, "accuracy_median"); },
                          RoundX);
  spread.caption = "Each round's global model as the participants measured it on their held-out "
                   "data before training (client_eval).";
  for (size_t i = 0; i < runs.size(); ++i) {
    Band band{i, {}, {}};
    for (const json& row : runs[i].rounds) {
      auto lo = ClientEval(row, "accuracy_min"), hi = ClientEval(row, "accuracy_max");
      if (lo && hi) {
        band.lower.emplace_back(RoundX(row, 0), *lo);
        band.upper.emplace_back(RoundX(row, 0), *hi);
      }
    }
    if (!band.lower.empty()) spread.bands.push_back(std::move(band));
  }
  charts.push_back(std::move(spread));

  charts.push_back(PerRound(runs, "Differential privacy spent", "round", "epsilon",
                            Field("epsilon"), RoundX));
  charts.back().caption = "The accountant's epsilon after each round, at the run's delta.";
  charts.push_back(PerRound(runs, "Staleness of applied updates", "version", "mean staleness (versions)",
                            Field("staleness_mean"), RoundX));
  charts.push_back(PerRound(runs, "Gossip: neighbours' disagreement", "round",
                            "mean squared distance",
                            [](size_t, const json& r) -> std::optional<double> {
                              auto g = r.find("gossip");
                              if (g == r.end() || !g->is_object()) return std::nullopt;
                              return Number(*g, "disagreement");
                            },
                            RoundX));
  return charts;
}

// ---- The summary: one row per run ----

struct Summary {
  std::string name, metric, final_value, best, final_loss, time, up, down, epsilon;
  int64_t rounds = 0, failures = 0;
};

Summary Summarise(const RunRecord& run) {
  Summary s;
  s.name = run.name;
  s.rounds = static_cast<int64_t>(run.rounds.size());
  const Headline h = HeadlineOf(run);
  s.metric = h.name.empty() ? "-" : h.name;
  std::optional<double> last, best;
  int64_t best_round = 0;
  double up = 0, down = 0;
  for (const json& row : run.rounds) {
    up += Number(row, "bytes_up").value_or(0);
    down += Number(row, "bytes_down").value_or(0);
    s.failures += static_cast<int64_t>(Number(row, "failures").value_or(0));
    if (auto v = h.get(row)) {
      last = v;
      if (!best || (h.higher_is_better ? *v > *best : *v < *best)) {
        best = v;
        best_round = static_cast<int64_t>(Number(row, "round").value_or(0));
      }
    }
  }
  // The final evaluation measured the last model (the rounds' client_eval the one before).
  if (run.final_eval) {
    up += Number(*run.final_eval, "bytes_up").value_or(0);
    down += Number(*run.final_eval, "bytes_down").value_or(0);
    if (auto v = h.get(*run.final_eval)) last = v;
  }
  const bool fraction = h.name.find("accuracy") != std::string::npos;
  auto show = [&](double v) { return fraction ? absl::StrFormat("%.2f%%", 100 * v) : Short(v); };
  s.final_value = last ? show(*last) : "-";
  s.best = best ? absl::StrFormat("%s (round %d)", show(*best), best_round) : "-";
  const json* end = run.final_eval ? &*run.final_eval : run.rounds.empty() ? nullptr : &run.rounds.back();
  std::optional<double> loss = end ? Loss(*end) : std::nullopt;
  s.final_loss = loss ? absl::StrFormat("%.4f", *loss) : "-";
  std::optional<double> elapsed = end ? Number(*end, "elapsed_s") : std::nullopt;
  s.time = elapsed ? Duration(*elapsed) : "-";
  s.up = Bytes(up);
  s.down = Bytes(down);
  std::optional<double> eps = run.rounds.empty() ? std::nullopt : Number(run.rounds.back(), "epsilon");
  s.epsilon = eps ? absl::StrFormat("%.3f", *eps) : "-";
  return s;
}

// Devices of unequal size (job section width): which method each run used, and the
// rate each device had in its last round. Empty when no run had a width section.
std::vector<std::vector<std::string>> UnequalDevices(const std::vector<RunRecord>& runs) {
  static const std::map<std::string, std::string> kMethods = {
      {"heterofl", "HeteroFL: width-scaled submodels, leading channels"},
      {"fedrolex", "FedRolex: width-scaled submodels, rolling window"},
      {"hetlora", "HetLoRA: per-device LoRA ranks, zero-padded mean"},
      {"flexlora", "FlexLoRA: per-device LoRA ranks, mean product factored by SVD"}};
  std::vector<std::vector<std::string>> rows;
  for (const RunRecord& r : runs) {
    if (r.width_method.empty()) continue;
    auto m = kMethods.find(r.width_method);
    std::vector<std::string> rates;
    if (!r.rounds.empty() && r.rounds.back().contains("widths") && r.rounds.back()["widths"].is_object()) {
      for (const auto& [client, rate] : r.rounds.back()["widths"].items()) {
        if (rate.is_number()) rates.push_back(absl::StrFormat("%s %g", client, rate.get<double>()));
      }
    }
    rows.push_back({r.name, m != kMethods.end() ? m->second : r.width_method, absl::StrJoin(rates, ", ")});
  }
  return rows;
}

const char* const kSummaryColumns[] = {"run", "rounds", "metric", "final", "best", "final loss",
                                       "wall time", "bytes up", "bytes down", "epsilon", "failures"};

std::vector<std::string> Cells(const Summary& s) {
  return {s.name, absl::StrCat(s.rounds), s.metric, s.final_value, s.best, s.final_loss,
          s.time, s.up, s.down, s.epsilon, absl::StrCat(s.failures)};
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

StatusOr<RunRecord> LoadRun(const std::string& run_dir) {
  RunRecord run;
  run.dir = run_dir;
  const std::string path = (fs::path(run_dir) / "metrics.jsonl").string();
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat(run_dir, ": no metrics.jsonl (not a run directory, or "
                                            "no round committed yet)"));
  }
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  size_t begin = 0;
  for (int line = 1; begin < text->size(); ++line) {
    const size_t end = text->find('\n', begin);
    if (end == std::string::npos) break;  // a torn last line: the run is writing it
    const std::string_view content(text->data() + begin, end - begin);
    begin = end + 1;
    if (content.empty()) continue;
    json row = json::parse(content, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded() || !row.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line, ": not a JSON object"));
    }
    if (row.value("evaluation_only", false)) {
      run.final_eval = std::move(row);
    } else {
      run.rounds.push_back(std::move(row));
    }
  }
  for (const char* kind : {"images", "labels", "tokens", "updates", "hijack"}) {
    auto attack = ReadFile((fs::path(run_dir) / "attack" / absl::StrCat(kind, ".json")).string());
    if (!attack.ok()) continue;
    json j = json::parse(*attack, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) run.attacks[kind] = std::move(j);
  }
  run.name = fs::path(run_dir).lexically_normal().filename().string();
  if (run.name.empty()) run.name = fs::path(run_dir).lexically_normal().parent_path().filename().string();
  if (auto config = ReadFile((fs::path(run_dir) / "config.yaml").string()); config.ok()) {
    run.config = *config;
    try {
      YAML::Node node = YAML::Load(run.config);
      if (node["run"] && node["run"]["name"] && node["run"]["name"].IsScalar()) {
        run.name = node["run"]["name"].as<std::string>();
      }
      if (const YAML::Node width = node["width"];
          width && width.IsMap() && !(width["enabled"] && width["enabled"].IsScalar() && !width["enabled"].as<bool>())) {
        const YAML::Node method = width["method"];
        run.width_method = method && method.IsScalar() ? method.as<std::string>() : "heterofl";
      }
    } catch (const YAML::Exception&) {  // the name stays the directory's
    }
  }
  return run;
}

namespace {

// What `cleave attack` measured on each run that recorded (RunRecord::attacks): a row per
// such run, its final headline value beside each attack's total, and the chart of the
// headline against the stronger image reconstruction's SSIM (the privacy frontier). Empty
// when no run has one.
struct Leakage {
  std::vector<std::vector<std::string>> rows;
  Chart chart;
};
const std::vector<std::string> kLeakageColumns = {
    "run", "final", "reconstruction SSIM (learned / optimised)", "labels from gradients (accuracy, AUC)",
    "labels that crossed, true", "tokens recovered (nearest / learned)", "federated updates: SSIM, labels",
    "a hijacking server's SSIM"};

Leakage LeakageOf(const std::vector<RunRecord>& runs) {
  Leakage out;
  out.chart.x_label = "reconstruction SSIM (the stronger attack)";
  auto num = [](const json& j, const char* key) -> std::optional<double> { return Number(j, key); };
  auto pct = [](std::optional<double> v) { return v ? absl::StrFormat("%.1f %%", 100 * *v) : std::string("-"); };
  for (size_t i = 0; i < runs.size(); ++i) {
    const json& a = runs[i].attacks;
    if (a.empty()) continue;
    const Summary s = Summarise(runs[i]);
    const json none = json::object();
    const json& img = a.contains("images") ? a["images"] : none;
    const json& lab = a.contains("labels") ? a["labels"] : none;
    const json& tok = a.contains("tokens") ? a["tokens"] : none;
    const json& upd = a.contains("updates") ? a["updates"] : none;
    const json& hij = a.contains("hijack") ? a["hijack"] : none;
    const auto learned = num(img, "learned_ssim"), optimised = num(img, "optimised_ssim");
    out.rows.push_back({
        runs[i].name, s.final_value,
        learned ? absl::StrCat(Short(*learned), " / ", optimised ? Short(*optimised) : "-") : "-",
        num(lab, "direction_accuracy")
            ? absl::StrCat(pct(num(lab, "direction_accuracy")), ", ", Short(*num(lab, "direction_auc")))
            : "-",
        pct(num(lab, "crossed_true")),
        num(tok, "nearest_rate") || num(tok, "learned_rate")
            ? absl::StrCat(pct(num(tok, "nearest_rate")), " / ", pct(num(tok, "learned_rate")))
            : "-",
        num(upd, "ssim") ? absl::StrCat(Short(*num(upd, "ssim")), ", ", pct(num(upd, "labels_right"))) : "-",
        num(hij, "hijack_ssim") ? Short(*num(hij, "hijack_ssim")) : "-"});
    const Headline h = HeadlineOf(runs[i]);
    std::optional<double> last;
    for (const json& row : runs[i].rounds) {
      if (auto v = h.get(row)) last = v;
    }
    if (learned && last) {
      out.chart.y_label = absl::StrCat("final ", h.name);
      out.chart.lines.push_back({i, {{std::max(*learned, optimised.value_or(0)), *last}}});
    }
  }
  out.chart.title = "Measured leakage: " + (out.chart.y_label.empty() ? "" : out.chart.y_label) +
                    " against reconstruction SSIM";
  out.chart.caption = "One point per run: what it reached against what a curious server reconstructed from its "
                      "record (cleave attack images); left and high is private and useful.";
  return out;
}

// The page up to its first table: its style and title.
constexpr char kHtmlHead[] = R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>cleave report</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1260px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; } td, th { border-bottom: 1px solid #ddd; padding: 4px 10px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 6px; vertical-align: -1px; }
.charts { display: flex; flex-wrap: wrap; gap: 8px 24px; }
figure { margin: 0; } figcaption { font-weight: 600; margin: 6px 0; } .note { color: #666; max-width: 600px; }
svg.chart text { font-size: 11px; fill: #444; }
svg.chart .grid { stroke: #eee; } svg.chart .tick, svg.chart .axis { stroke: #888; }
svg.chart .series { fill: none; stroke-width: 2; } svg.chart .band { opacity: 0.18; }
pre { background: #f6f6f6; padding: 8px; overflow: auto; max-height: 400px; }
</style></head><body>
<h1>cleave report</h1>
)";

}  // namespace

std::string ReportHtml(const std::vector<RunRecord>& runs) {
  std::string html = kHtmlHead;
  absl::StrAppend(&html, "<table id=\"summary\"><tr>");
  for (const char* c : kSummaryColumns) absl::StrAppend(&html, "<th>", c, "</th>");
  absl::StrAppend(&html, "</tr>\n");
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::vector<std::string> cells = Cells(Summarise(runs[i]));
    absl::StrAppend(&html, "<tr><td><span class=\"swatch\" style=\"background:", Color(i),
                    "\"></span>", HtmlEscape(cells[0]), "</td>");
    for (size_t c = 1; c < cells.size(); ++c) absl::StrAppend(&html, "<td>", HtmlEscape(cells[c]), "</td>");
    absl::StrAppend(&html, "</tr>\n");
  }
  absl::StrAppend(&html, "</table>\n<p class=\"note\">Final: the last model's value (the final "
                         "evaluation's, when the run had one). Bytes: what crossed the transport, "
                         "framing included.</p>\n");
  if (const auto devices = UnequalDevices(runs); !devices.empty()) {
    absl::StrAppend(&html, "<h2>Devices of unequal size</h2>\n<table id=\"widths\"><tr><th>run</th>"
                           "<th>method</th><th>rates in the last round</th></tr>\n");
    for (const auto& row : devices) {
      absl::StrAppend(&html, "<tr><td>", HtmlEscape(row[0]), "</td><td>", HtmlEscape(row[1]), "</td><td>", HtmlEscape(row[2]),
                      "</td></tr>\n");
    }
    absl::StrAppend(&html, "</table>\n<p class=\"note\">A rate is the fraction of every hidden layer "
                           "(submodels) or of model.lora.rank (LoRA ranks) a device trained.</p>\n");
  }
  const Leakage leakage = LeakageOf(runs);
  if (!leakage.rows.empty()) {
    absl::StrAppend(&html, "<h2>Measured leakage</h2>\n<table id=\"leakage\"><tr>");
    for (const std::string& c : kLeakageColumns) absl::StrAppend(&html, "<th>", HtmlEscape(c), "</th>");
    absl::StrAppend(&html, "</tr>\n");
    for (const auto& row : leakage.rows) {
      absl::StrAppend(&html, "<tr>");
      for (const std::string& c : row) absl::StrAppend(&html, "<td>", HtmlEscape(c), "</td>");
      absl::StrAppend(&html, "</tr>\n");
    }
    absl::StrAppend(&html, "</table>\n<p class=\"note\">From cleave attack on the runs' records "
                           "(split.record, server.record_updates), scored against the devices' own copies "
                           "(docs/security.md, \"Measured leakage\").</p>\n");
  }
  absl::StrAppend(&html, "<div class=\"charts\">\n");
  if (!leakage.chart.empty()) {
    absl::StrAppend(&html, "<figure><figcaption>", HtmlEscape(leakage.chart.title), "</figcaption>\n",
                    Svg(leakage.chart), "<p class=\"note\">", HtmlEscape(leakage.chart.caption), "</p></figure>\n");
  }
  for (const Chart& chart : Charts(runs)) {
    if (chart.empty()) continue;
    absl::StrAppend(&html, "<figure><figcaption>", HtmlEscape(chart.title), "</figcaption>\n", Svg(chart));
    if (!chart.caption.empty()) absl::StrAppend(&html, "<p class=\"note\">", HtmlEscape(chart.caption), "</p>");
    absl::StrAppend(&html, "</figure>\n");
  }
  if (std::string split = StepBreakdown(runs); !split.empty()) {
    absl::StrAppend(&html, "<figure><figcaption>Split learning: mean step time</figcaption>\n", split,
                    "<p class=\"note\">As the clients measured it: their part's compute, the "
                    "transfer (waiting minus the server's compute) and the server part's compute "
                    "(including waiting its turn).</p></figure>\n");
  }
  absl::StrAppend(&html, PipelineTimelines(runs));
  absl::StrAppend(&html, "</div>\n<h2>Runs</h2>\n");
  for (size_t i = 0; i < runs.size(); ++i) {
    absl::StrAppend(&html, "<details><summary><span class=\"swatch\" style=\"background:", Color(i),
                    "\"></span>", HtmlEscape(runs[i].name), ": ", HtmlEscape(runs[i].dir),
                    "</summary>\n<pre>", HtmlEscape(runs[i].config.empty() ? "(no config.yaml)" : runs[i].config),
                    "</pre></details>\n");
  }
  return html + "</body></html>\n";
}

std::string ReportMarkdown(const std::vector<RunRecord>& runs) {
  auto row = [](const std::vector<std::string>& cells) {
    std::vector<std::string> escaped;
    for (const std::string& c : cells) {
      std::string e;
      for (char ch : c) {
        if (ch == '|') e += "\\|";
        else if (ch == '\n' || ch == '\r') e += ' ';
        else e += ch;
      }
      escaped.push_back(std::move(e));
    }
    return absl::StrCat("| ", absl::StrJoin(escaped, " | "), " |\n");
  };
  std::vector<std::string> header(std::begin(kSummaryColumns), std::end(kSummaryColumns));
  std::string md = row(header);
  absl::StrAppend(&md, "|", absl::StrJoin(std::vector<std::string>(header.size(), "---"), "|"), "|\n");
  for (const RunRecord& r : runs) absl::StrAppend(&md, row(Cells(Summarise(r))));
  if (const auto devices = UnequalDevices(runs); !devices.empty()) {
    absl::StrAppend(&md, "\n", row({"run", "method", "rates in the last round"}), "|---|---|---|\n");
    for (const auto& d : devices) absl::StrAppend(&md, row(d));
  }
  if (const Leakage leakage = LeakageOf(runs); !leakage.rows.empty()) {
    absl::StrAppend(&md, "\n", row(kLeakageColumns), "|",
                    absl::StrJoin(std::vector<std::string>(kLeakageColumns.size(), "---"), "|"), "|\n");
    for (const auto& r : leakage.rows) absl::StrAppend(&md, row(r));
  }
  return md;
}

std::string ReportCsv(const std::vector<RunRecord>& runs) {
  std::string csv =
      "run,round,final_evaluation,elapsed_s,wall_s,participants,failures,bytes_up,bytes_down,"
      "train_loss,test_accuracy,test_loss,client_accuracy,client_loss,epsilon\n";
  auto number = [](std::optional<double> v) { return v ? absl::StrFormat("%.10g", *v) : std::string(); };
  for (const RunRecord& r : runs) {
    std::vector<const json*> rows;
    for (const json& row : r.rounds) rows.push_back(&row);
    if (r.final_eval) rows.push_back(&*r.final_eval);
    for (const json* row : rows) {
      absl::StrAppend(&csv, CsvField(r.name), ",", number(Number(*row, "round")), ",",
                      row == rows.back() && r.final_eval ? 1 : 0);
      for (const char* key : {"elapsed_s", "wall_s", "participants", "failures", "bytes_up",
                              "bytes_down", "train_loss", "test_accuracy", "test_loss"}) {
        absl::StrAppend(&csv, ",", number(Number(*row, key)));
      }
      absl::StrAppend(&csv, ",", number(ClientEval(*row, "accuracy")), ",",
                      number(ClientEval(*row, "loss")), ",", number(Number(*row, "epsilon")), "\n");
    }
  }
  return csv;
}

StatusOr<std::string> WriteReport(const ReportOptions& options) {
  if (options.run_dirs.empty()) return absl::InvalidArgumentError("no run directory given");
  std::vector<RunRecord> runs;
  for (const std::string& dir : options.run_dirs) {
    auto run = LoadRun(dir);
    if (!run.ok()) return run.status();
    runs.push_back(*std::move(run));
  }
  std::string out = options.out;
  if (out.empty()) {
    out = options.run_dirs.size() == 1 ? (fs::path(options.run_dirs[0]) / "report").string() : "report";
  }
  for (auto [suffix, text] : {std::pair{".html", ReportHtml(runs)}, std::pair{".md", ReportMarkdown(runs)},
                              std::pair{".csv", ReportCsv(runs)}}) {
    if (Status s = WriteFileAtomic(out + suffix, text); !s.ok()) return s;
  }
  return out + ".html";
}

int RunReport(const ReportOptions& options) {
  auto html = WriteReport(options);
  if (!html.ok()) {
    std::cerr << "cleave report: " << html.status().message() << "\n";
    return 1;
  }
  const std::string stem = html->substr(0, html->size() - 5);
  std::cout << "report: " << *html << " (tables: " << stem << ".md, " << stem << ".csv)\n";
  return 0;
}

void PrintReport(const std::string& run_dir) {
  if (auto report = WriteReport({{run_dir}, ""}); report.ok()) {
    std::cout << "report: " << *report << "\n";
  } else {
    std::cout << "no report: " << report.status().message() << "\n";
  }
}

}  // namespace cleave
