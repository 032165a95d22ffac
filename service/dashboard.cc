#include "service/dashboard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/clock.h"
#include "core/printable.h"

namespace cleave {
namespace {

constexpr const char* kHead = R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>cleave daemon</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 2em; color: #222 }
table { border-collapse: collapse; margin-bottom: 2em }
th, td { padding: .3em .8em; border-bottom: 1px solid #ddd; text-align: left; vertical-align: top }
.queued { color: #666 } .running { color: #0560c0 } .succeeded { color: #087a2c }
.failed { color: #b00020 } .cancelled { color: #8a5a00 }
</style></head><body>
<h1>cleave daemon</h1>
)";


std::string Cell(const std::string& text) { return absl::StrCat("<td>", HtmlEscape(text), "</td>"); }

std::string JobRow(const JobRecord& j) {
  const std::string state = JobStateName(j.state);
  return absl::StrCat("<tr>", Cell(j.id), Cell(j.name), Cell(j.submitter), "<td class=\"", state, "\">", state,
                      "</td>", Cell(std::to_string(j.priority)),
                      Cell(absl::StrCat(j.committed_round, "/", j.total_rounds)),
                      Cell(j.evaluated ? absl::StrFormat("%.4f", j.accuracy) : "-"),
                      Cell(j.evaluated ? absl::StrFormat("%.4f", j.loss) : "-"), Cell(UnixMsText(j.started_ms)),
                      Cell(j.state == JobState::kRunning ? UnixMsText(j.expected_end_ms) : UnixMsText(j.ended_ms)),
                      Cell(j.reason), "</tr>\n");
}

std::string ClientRow(const PoolMemberView& m) {
  std::vector<std::string> datasets, jobs;
  for (const v1::PoolDataset& d : m.hello.datasets()) datasets.push_back(absl::StrCat(d.name(), " (", d.examples(), ")"));
  for (const auto& [id, held] : m.jobs) jobs.push_back(held.accepted ? id : id + " (offered)");
  if (m.PausedAt(UnixNowMs())) jobs.push_back("paused until " + UnixMsText(m.paused_until_ms) + ": " + m.pause_reason);
  const v1::SitePolicy& p = m.hello.policy();
  return absl::StrCat("<tr>", Cell(m.name), Cell(absl::StrJoin(datasets, ", ")),
                      Cell(jobs.empty() ? "-" : absl::StrJoin(jobs, ", ")),
                      Cell(p.given() ? absl::StrCat("site policy, ", std::max(1, p.max_concurrent_jobs()), " job(s) at once")
                                     : "no site policy"),
                      "</tr>\n");
}

}  // namespace

std::vector<const JobRecord*> ShownJobs(const std::vector<JobRecord>& jobs, size_t ended) {
  std::vector<const JobRecord*> shown;
  size_t n = 0;
  for (auto it = jobs.rbegin(); it != jobs.rend(); ++it) {
    if (!JobEnded(it->state) || n++ < ended) shown.push_back(&*it);
  }
  return shown;
}

std::string DaemonDashboardHtml(const std::vector<JobRecord>& jobs, const std::vector<PoolMemberView>& clients,
                                int64_t resident_bytes) {
  int queued = 0, running = 0;
  for (const JobRecord& j : jobs) {
    queued += j.state == JobState::kQueued;
    running += j.state == JobState::kRunning;
  }
  std::string html = absl::StrCat(kHead, "<p>", queued, " queued, ", running, " running, ", jobs.size(),
                                  " submitted; ", clients.size(), " client(s) attached; ", resident_bytes >> 20,
                                  " MiB resident</p>\n<h2>Jobs</h2>\n<table><tr><th>job</th><th>name</th>"
                                  "<th>submitter</th><th>state</th><th>priority</th><th>rounds</th><th>accuracy</th>"
                                  "<th>loss</th><th>started (UTC)</th><th>ends / ended (UTC)</th><th>reason</th></tr>\n");
  for (const JobRecord* j : ShownJobs(jobs)) html += JobRow(*j);
  html += "</table>\n<h2>Clients</h2>\n<table><tr><th>client</th><th>datasets (examples)</th><th>jobs</th>"
          "<th>policy</th></tr>\n";
  for (const PoolMemberView& m : clients) html += ClientRow(m);
  return html + "</table>\n</body></html>\n";
}

}  // namespace cleave
