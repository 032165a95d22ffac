// `cleave job ...`: a daemon's job API (proto/cleave/v1/jobs.proto) from the command
// line: submit, list, status, logs, cancel, download.
#pragma once

#include <string>

namespace cleave {

struct JobCliOptions {
  std::string server;  // the daemon's job API, HOST:PORT
  std::string ca, cert, key;  // TLS: the daemon's CA; a client certificate (identity: its CN)
  std::string token_file;     // a bearer token (identity: the policy's name for it)
  bool insecure = false;
};

// Each prints what it got (or the daemon's error, to stderr) and returns the exit code.
int JobSubmit(const JobCliOptions& o, const std::string& config_path);
int JobList(const JobCliOptions& o);
int JobStatus(const JobCliOptions& o, const std::string& id);
int JobLogs(const JobCliOptions& o, const std::string& id, bool follow);
int JobCancel(const JobCliOptions& o, const std::string& id);
// The audit log, a line an entry: when, who, what, the job, its digest's first 12 hex
// digits, the outcome.
int JobAudit(const JobCliOptions& o);
// The job's run directory into `out`, then its report (out/report.html, .md, .csv).
int JobDownload(const JobCliOptions& o, const std::string& id, const std::string& out);

}  // namespace cleave
