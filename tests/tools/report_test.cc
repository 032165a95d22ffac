// `cleave report`: runs' metrics.jsonl into an HTML page of SVG plots and tables.
#include "tools/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "core/files.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cleave-report-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A run directory with these metrics lines (and a config naming the run).
  std::string Run(const std::string& name, const std::vector<json>& rows, const std::string& tail = "") {
    const fs::path run = dir_ / name;
    fs::create_directories(run);
    std::ofstream(run / "config.yaml") << "run: {name: \"" << name << "\", rounds: 3}\n";
    std::ofstream metrics(run / "metrics.jsonl");
    for (const json& r : rows) metrics << r.dump() << "\n";
    metrics << tail;
    return run.string();
  }

  // A FedAvg run whose accuracy rises by `gain` a round, with federated evaluation.
  static std::vector<json> Rounds(int n, double gain, bool dp = false) {
    std::vector<json> rows;
    for (int r = 1; r <= n; ++r) {
      json j = {{"round", r}, {"test_accuracy", 0.1 + gain * r}, {"test_loss", 2.0 / r},
                {"train_loss", 1.5 / r}, {"participants", 4}, {"failures", r == 2 ? 1 : 0},
                {"bytes_up", 1000000}, {"bytes_down", 2000000}, {"wall_s", 1.5},
                {"elapsed_s", 2.0 * r},
                {"client_eval", {{"accuracy", 0.2 * r / n}, {"accuracy_min", 0.1 * r / n},
                                 {"accuracy_median", 0.2 * r / n}, {"accuracy_max", 0.3 * r / n},
                                 {"loss", 1.0}}}};
      if (dp) j["epsilon"] = 0.5 * r;
      rows.push_back(j);
    }
    return rows;
  }

  fs::path dir_;
};

// The points of each <polyline> in the page, in order.
std::vector<size_t> PolylineLengths(const std::string& html) {
  std::vector<size_t> lengths;
  std::regex polyline("<polyline[^>]*points=\"([^\"]*)\"");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), polyline); it != std::sregex_iterator(); ++it) {
    std::istringstream points((*it)[1].str());
    size_t n = 0;
    for (std::string p; points >> p;) ++n;
    lengths.push_back(n);
  }
  return lengths;
}

TEST_F(ReportTest, TwoRunsSideBySide) {
  const std::string a = Run("fedavg", Rounds(3, 0.2));
  const std::string b = Run("fedprox", Rounds(5, 0.1, /*dp=*/true));
  const fs::path out = dir_ / "both";
  auto html_path = WriteReport({{a, b}, out.string()});
  ASSERT_TRUE(html_path.ok()) << html_path.status().message();
  EXPECT_EQ(*html_path, out.string() + ".html");
  const std::string html = *ReadFile(*html_path);

  // Self-contained: no script, nothing loaded from elsewhere.
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("src=")));
  EXPECT_THAT(html, Not(HasSubstr("http")));
  // Both runs in the summary, with their final and best accuracy and total bytes.
  EXPECT_THAT(html, HasSubstr("<td>70.00%</td><td>70.00% (round 3)</td>"));
  EXPECT_THAT(html, HasSubstr("<td>60.00%</td><td>60.00% (round 5)</td>"));
  EXPECT_THAT(html, HasSubstr("<td>3.0 MB</td><td>6.0 MB</td>"));  // fedavg's up, down
  EXPECT_THAT(html, HasSubstr("<td>2.500</td>"));                     // fedprox's epsilon
  // Eight charts of a line per run (accuracy against round, time and bytes; loss;
  // training loss; round time; bytes per round; the clients' median), then epsilon for
  // the DP run alone; no chart of data neither run has (staleness, gossip, split).
  const std::vector<size_t> lines = PolylineLengths(html);
  std::vector<size_t> expected;
  for (int chart = 0; chart < 8; ++chart) expected.insert(expected.end(), {3, 5});
  expected.push_back(5);
  EXPECT_EQ(lines, expected);
  EXPECT_THAT(html, HasSubstr("Differential privacy spent"));
  EXPECT_THAT(html, Not(HasSubstr("Staleness")));
  EXPECT_THAT(html, Not(HasSubstr("Split learning")));
  // The clients' spread: a shaded band (min to max) per run.
  size_t bands = 0;
  for (size_t at = 0; (at = html.find("<polygon class=\"band\"", at)) != std::string::npos; ++at) ++bands;
  EXPECT_EQ(bands, 2u);

  const std::string md = *ReadFile(out.string() + ".md");
  EXPECT_THAT(md, HasSubstr("| fedavg | 3 | test accuracy | 70.00% | 70.00% (round 3) | 0.6667 | 6.0 s | "
                            "3.0 MB | 6.0 MB | - | 1 |"));
  EXPECT_THAT(md, HasSubstr("| fedprox | 5 | test accuracy | 60.00% |"));

  // The CSV: a header and one row per round, the values as recorded.
  std::istringstream csv(*ReadFile(out.string() + ".csv"));
  std::vector<std::string> rows;
  for (std::string line; std::getline(csv, line);) rows.push_back(line);
  ASSERT_EQ(rows.size(), 1u + 3 + 5);
  EXPECT_THAT(rows[0], HasSubstr("run,round,final_evaluation,elapsed_s"));
  EXPECT_EQ(rows[2], "fedavg,2,0,4,1.5,4,1,1000000,2000000,0.75,0.5,1,0.1333333333,1,");
  EXPECT_EQ(rows[8].substr(0, 10), "fedprox,5,");
  EXPECT_EQ(rows[8].substr(rows[8].rfind(',') + 1), "2.5");
}

TEST_F(ReportTest, OneRunDefaultsIntoItsDirectoryAndEscapesWhatItShows) {
  std::vector<json> rows = Rounds(2, 0.3);
  json final_eval = {{"round", 2}, {"evaluation_only", true}, {"participants", 4}, {"failures", 0},
                     {"bytes_up", 10}, {"bytes_down", 5000}, {"elapsed_s", 9.0},
                     {"client_eval", {{"accuracy", 0.9}, {"loss", 0.25}}}};
  rows.push_back(final_eval);
  for (json& r : rows) r.erase("test_accuracy"), r.erase("test_loss");  // clients evaluate
  const std::string run = Run("a<b>&\"c", rows, "{\"round\": 3, \"torn");
  auto html_path = WriteReport({{run}, ""});
  ASSERT_TRUE(html_path.ok()) << html_path.status().message();
  EXPECT_EQ(*html_path, (fs::path(run) / "report.html").string());
  const std::string html = *ReadFile(*html_path);
  EXPECT_THAT(html, HasSubstr("a&lt;b&gt;&amp;&quot;c"));
  EXPECT_THAT(html, Not(HasSubstr("a<b>")));
  // The final model is the final evaluation's (90 %); the best of the rounds is 20 %.
  EXPECT_THAT(html, HasSubstr("<td>client accuracy</td><td>90.00%</td><td>20.00% (round 2)</td>"
                              "<td>0.2500</td><td>9.0 s</td>"));
  // The torn last line (a run still writing) is left out: two rounds plotted.
  EXPECT_EQ(PolylineLengths(html).front(), 2u);
  const std::string csv = *ReadFile((fs::path(run) / "report.csv").string());
  EXPECT_THAT(csv, HasSubstr("\"a<b>&\"\"c\",2,1,9,"));  // quoted; the final evaluation's row
}

TEST_F(ReportTest, SplitRunsGetTheirStepTimeBreakdown) {
  std::vector<json> rows = Rounds(2, 0.1);
  for (json& r : rows) {
    r["step_s"] = 0.012;
    r["client_compute_s"] = 0.004;
    r["transfer_s"] = 0.006;
    r["server_compute_s"] = 0.002;
  }
  auto html = WriteReport({{Run("sfl", rows)}, ""});
  ASSERT_TRUE(html.ok());
  const std::string page = *ReadFile(*html);
  EXPECT_THAT(page, HasSubstr("Split learning: mean step time"));
  EXPECT_THAT(page, HasSubstr("<title>4.00 ms</title>"));
  EXPECT_THAT(page, HasSubstr(">12.0 ms</text>"));
}

// Runs that a curious server's attacks measured (cleave attack's RUN_DIR/attack/*.json):
// their leakage beside their final accuracy, in a table and as one point each on the
// frontier chart (x the stronger reconstruction's SSIM, y the final accuracy); a run
// without attacks has no row, and a report without any has no such section.
TEST_F(ReportTest, RecordedRunsGetTheirMeasuredLeakage) {
  const std::string open = Run("open", Rounds(3, 0.2)), noisy = Run("noisy", Rounds(3, 0.1)), plain = Run("plain", Rounds(2, 0.1));
  fs::create_directories(fs::path(open) / "attack");
  fs::create_directories(fs::path(noisy) / "attack");
  std::ofstream(fs::path(open) / "attack" / "images.json")
      << R"({"images": 64, "learned_ssim": 0.71, "optimised_ssim": 0.76, "mean_ssim": 0.12, "round": 0})";
  std::ofstream(fs::path(open) / "attack" / "labels.json")
      << R"({"examples": 40, "direction_auc": 0.915, "direction_accuracy": 0.867, "crossed_true": 1.0})";
  std::ofstream(fs::path(noisy) / "attack" / "images.json") << R"({"images": 64, "learned_ssim": 0.31, "round": 0})";
  std::ofstream(fs::path(noisy) / "attack" / "updates.json") << "not json";  // ignored
  std::ofstream(fs::path(noisy) / "attack" / "hijack.json") << R"({"images": 256, "hijack_ssim": 0.52, "mean_ssim": 0.14})";
  auto html = WriteReport({{open, noisy, plain}, (dir_ / "report").string()});
  ASSERT_TRUE(html.ok()) << html.status();
  const std::string page = *ReadFile(*html);
  EXPECT_THAT(page, HasSubstr("<h2>Measured leakage</h2>"));
  EXPECT_THAT(page, HasSubstr("<tr><td>open</td><td>70.00%</td><td>0.71 / 0.76</td><td>86.7 %, 0.915</td>"
                              "<td>100.0 %</td><td>-</td><td>-</td><td>-</td></tr>"));
  EXPECT_THAT(page, HasSubstr("<tr><td>noisy</td><td>40.00%</td><td>0.31 / -</td><td>-</td><td>-</td><td>-</td><td>-</td>"
                              "<td>0.52</td></tr>"));
  EXPECT_THAT(page, Not(HasSubstr("<tr><td>plain</td><td>")));
  EXPECT_THAT(page, HasSubstr("<title>0.76, 0.7</title>")) << "open's point: the stronger attack's SSIM";
  EXPECT_THAT(page, HasSubstr("<title>0.31, 0.4</title>"));
  const std::string md = *ReadFile((dir_ / "report.md").string());
  EXPECT_THAT(md, HasSubstr("| open | 70.00% | 0.71 / 0.76 |"));

  auto without = WriteReport({{plain}, (dir_ / "plain-report").string()});
  ASSERT_TRUE(without.ok());
  EXPECT_THAT(*ReadFile(*without), Not(HasSubstr("Measured leakage")));
}

// Devices of unequal size: the method the config names, in words, and each device's
// rate in the last round; no such section for a run without width.
TEST_F(ReportTest, WidthRunsSayWhichMethodAndRates) {
  std::vector<json> rows = Rounds(2, 0.1);
  rows.back()["widths"] = {{"phone", 0.25}, {"server", 1.0}};
  const std::string run = Run("ranks", rows);
  std::ofstream(fs::path(run) / "config.yaml", std::ios::app) << "width: {method: flexlora}\n";
  auto html = WriteReport({{run}, ""});
  ASSERT_TRUE(html.ok()) << html.status();
  const std::string page = *ReadFile(*html);
  EXPECT_THAT(page, HasSubstr("FlexLoRA: per-device LoRA ranks, mean product factored by SVD"));
  EXPECT_THAT(page, HasSubstr("phone 0.25, server 1"));
  auto plain = WriteReport({{Run("plain", Rounds(2, 0.1))}, ""});
  ASSERT_TRUE(plain.ok());
  EXPECT_THAT(*ReadFile(*plain), Not(HasSubstr("Devices of unequal size")));
}

// A pipeline run: each chain of its last round gets a timeline, a bar per device pass
// over the first batch, placed by its time and named by its micro-batch; a span that
// is not well formed is left out, not drawn.
TEST_F(ReportTest, PipelineRunsGetEachChainsTimeline) {
  std::vector<json> rows = Rounds(2, 0.1);
  rows[1]["pipeline"] = json::array(
      {{{"devices", {"client-0", "client-1"}},
        {"bounds", {0, 1, 3}},
        {"done", true},
        {"busy", {0.5, 0.25}},
        {"bubble", 0.6},
        {"spans", {{0, 0, "F", 0.0, 0.001}, {1, 0, "F", 0.002, 0.004}, {1, 0, "B", 0.006, 0.010},
                   {0, 0, "B", 0.011, 0.012}, {7, 0, "F", 0.0, 1.0}, {"bad"}}}}});
  auto html = WriteReport({{Run("pipe", rows)}, ""});
  ASSERT_TRUE(html.ok());
  const std::string page = *ReadFile(*html);
  EXPECT_THAT(page, HasSubstr("pipe: pipeline chain 0 (round 2), bubble 60%"));
  EXPECT_THAT(page, HasSubstr("client-1 (25%)"));
  EXPECT_THAT(page, HasSubstr("<title>backward 0: 4.00 ms</title>"));
  EXPECT_THAT(page, HasSubstr(">12.0 ms</text>")) << "the axis ends at the last span, not the ill-formed one";
  size_t bars = 0;
  for (size_t at = page.find("<title>forward"); at != std::string::npos; at = page.find("<title>forward", at + 1)) ++bars;
  EXPECT_EQ(bars, 2u);
}

// Values far apart in magnitude from their spread (a loss near 1e15 moving by 0.01)
// still make a finite chart with a bounded number of ticks.
TEST_F(ReportTest, ValuesBeyondTheirPrecisionStillDraw) {
  std::vector<json> rows = Rounds(3, 0.1);
  for (size_t i = 0; i < rows.size(); ++i) rows[i]["train_loss"] = 1e15 + 0.01 * static_cast<double>(i);
  auto html = WriteReport({{Run("huge", rows)}, ""});
  ASSERT_TRUE(html.ok());
  const std::string page = *ReadFile(*html);
  EXPECT_THAT(page, HasSubstr("Training loss against round"));
  EXPECT_LT(std::count(page.begin(), page.end(), '\n'), 2000);
}

// Ticks of values that move below four significant digits (the bytes of a round, 3.572 MB
// give or take a few bytes) get labels that tell them apart.
TEST_F(ReportTest, TickLabelsTellTheirTicksApart) {
  std::vector<json> rows = Rounds(4, 0.1);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i]["bytes_up"] = 3572000 + 7 * static_cast<int>(i);
    rows[i]["bytes_down"] = 0;
  }
  auto html = WriteReport({{Run("bytes", rows)}, ""});
  ASSERT_TRUE(html.ok());
  const std::string page = *ReadFile(*html);
  const size_t title = page.find("aria-label=\"Bytes per round\"");
  ASSERT_NE(title, std::string::npos);
  const std::string chart = page.substr(title, page.find("</svg>", title) - title);
  std::vector<std::string> labels;
  const std::string open = "text-anchor=\"end\">";  // the y axis' labels
  for (size_t at = chart.find(open); at != std::string::npos; at = chart.find(open, at + 1)) {
    const size_t begin = at + open.size();
    labels.push_back(chart.substr(begin, chart.find('<', begin) - begin));
  }
  ASSERT_GE(labels.size(), 3u) << chart;
  EXPECT_EQ(std::set<std::string>(labels.begin(), labels.end()).size(), labels.size())
      << ::testing::PrintToString(labels);
  EXPECT_THAT(labels, ::testing::Contains(::testing::StartsWith("3.57201")));
}

TEST_F(ReportTest, BadRunDirectoriesAreClearErrors) {
  auto missing = WriteReport({{(dir_ / "nothing").string()}, ""});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("no metrics.jsonl"));

  const std::string bad = Run("bad", Rounds(2, 0.1), "not json\n");
  auto malformed = WriteReport({{bad}, ""});
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(malformed.status().message()), HasSubstr("metrics.jsonl:3: not a JSON object"));
  EXPECT_FALSE(fs::exists(fs::path(bad) / "report.html"));

  EXPECT_EQ(WriteReport({{}, ""}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave
