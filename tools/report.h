// `cleave report RUN_DIR...`: one or several runs side by side, from their metrics.jsonl,
// as a self-contained HTML page (SVG plots, no scripts, nothing fetched), a Markdown table
// and a CSV file of every round for papers.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace cleave {

// One run as its metrics.jsonl recorded it.
struct RunRecord {
  std::string dir;
  std::string name;              // config.yaml's run.name, else the directory's name
  std::string config;            // config.yaml's text ("" when absent)
  std::string width_method;      // config.yaml's width.method when it has a width section
  std::vector<nlohmann::json> rounds;       // one per committed round (or applied buffer)
  std::optional<nlohmann::json> final_eval;  // the evaluation-only line, if any
  // What `cleave attack` measured on the run: RUN_DIR/attack/KIND.json by KIND (images,
  // labels, tokens, updates; tools/attack.h); an empty object when none ran.
  nlohmann::json attacks = nlohmann::json::object();
};

// Reads RUN_DIR/metrics.jsonl (and config.yaml). NOT_FOUND without metrics.jsonl;
// INVALID_ARGUMENT naming the file and line for a line that is not a JSON object. A torn
// last line (a run still writing) is left out.
StatusOr<RunRecord> LoadRun(const std::string& run_dir);

std::string ReportHtml(const std::vector<RunRecord>& runs);
std::string ReportMarkdown(const std::vector<RunRecord>& runs);  // one row per run
std::string ReportCsv(const std::vector<RunRecord>& runs);       // one row per round

struct ReportOptions {
  std::vector<std::string> run_dirs;
  // Writes OUT.html, OUT.md and OUT.csv; default RUN_DIR/report for one run, ./report for
  // several.
  std::string out;
};
// Loads every run and writes the three files; returns the HTML's path.
StatusOr<std::string> WriteReport(const ReportOptions& options);
int RunReport(const ReportOptions& options);
// After `cleave local` or `cleave simulate`: writes RUN_DIR/report.* and prints
// "report: PATH" (or why there is none; never fails the run).
void PrintReport(const std::string& run_dir);

}  // namespace cleave
