// Daemon: a long-running cleave-server (cleave-server --daemon) that runs the jobs its
// users submit, one after another, over clients that stay installed (cleave-client
// --stay rejoins for each next job). It owns the job store (service/job_store.h), the
// policy file (service/access_policy.h) and the job API (proto/cleave/v1/jobs.proto,
// service/job_service.cc) on its own port; each job runs as a Server (server/server.h)
// on the clients' port, with its run directory under the state directory
// (STATE_DIR/jobs/ID). Stopping the daemon stops the running job after its last
// committed round; the next start resumes it from its checkpoint.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "service/access_policy.h"
#include "service/job_store.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace cleave {

class HttpEndpoint;  // core/http_endpoint.h
class JobService;    // service/job_service.h
class Server;        // server/server.h

struct DaemonOptions {
  std::string state_dir;       // jobs.db, daemon.addr and each job's run directory
  std::string listen;          // the job API's address (port 0: any free one)
  std::string clients_listen;  // where each job serves its clients (the jobs' server.listen)
  std::string policy;          // the policy file
  // TLS of both ports: the server's certificate and key, and the CA that client
  // certificates chain to (mutual TLS for the jobs' clients when their tls.mutual
  // says so; optional on the job API, where a certificate's CN is its caller's identity).
  std::string tls_cert, tls_key, tls_ca;
  bool insecure = false;  // plaintext on both ports, when no certificate is given
  int max_queued = 100;
  size_t max_job_bytes = 1 << 20;  // the largest job file accepted
  bool paused = false;  // accept and queue jobs, start none (maintenance)
  // Where to serve /metrics (Prometheus; plain HTTP on loopback only, else HTTPS with
  // tls_cert); empty: nowhere.
  std::string metrics_listen;
};

// The daemon's /metrics: jobs by state, the process's resident memory, and per job
// (those queued or running, and the 20 that ended last, so labels stay bounded) its
// state, rounds, test accuracy and forecast end.
std::string DaemonMetricsText(const std::vector<JobRecord>& jobs, int64_t resident_bytes);

// When a job of `total` rounds is expected to end (Unix ms), from the rounds it committed
// in this run of it, each with its time (Unix ms), and the wall time of its last round
// (seconds): at the pace of the rounds committed so far (their mean interval; with one,
// its wall time). 0 before the first commit.
int64_t ForecastEnd(const std::vector<std::pair<int64_t, int64_t>>& commits, double last_wall_s, int64_t total);

class Daemon {
 public:
  static StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();

  int port() const { return port_; }
  int metrics_port() const;
  // Blocks until Stop.
  void Wait();
  // Stops the job API and the running job (it resumes at the next start). Any thread.
  void Stop();

  // The job API's operations, for a caller `who` (an authenticated identity).
  StatusOr<JobRecord> Submit(const std::string& who, const std::string& yaml);
  StatusOr<std::vector<JobRecord>> List(const std::string& who);
  StatusOr<JobRecord> Get(const std::string& who, const std::string& id);
  StatusOr<JobRecord> Cancel(const std::string& who, const std::string& id);
  // The run directory of a job `who` may read.
  StatusOr<std::string> RunDirOf(const std::string& who, const std::string& id);
  // The audit log, for an administrator.
  StatusOr<std::vector<AuditEntry>> AuditLog(const std::string& who);
  // Whether job `id` has ended (Logs' follow ends there).
  bool Ended(const std::string& id);

  // The identity of a bearer token, by the current policy; empty when none.
  std::string IdentityOfToken(const std::string& token);

 private:
  explicit Daemon(DaemonOptions options);
  // May `who` act with `right` on `job` (its submitter may read and cancel it with the
  // submit right)? PERMISSION_DENIED naming what is missing.
  Status Allowed(const std::string& who, Right right, const JobRecord* job);
  // A refused request, in the audit log (its failure logged).
  void AuditRefusal(const AuditEntry& e);
  void RunJobs();
  // Runs job `j` until it ends or the daemon stops: its end state and reason.
  std::pair<JobState, std::string> RunJob(const JobRecord& j);
  // The record with the running job's live progress.
  JobRecord Live(JobRecord j) ABSL_LOCKS_EXCLUDED(mu_);

  const DaemonOptions opts_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<PolicyFile> policy_;
  std::unique_ptr<JobService> service_;  // outlives api_, which serves it
  std::unique_ptr<grpc::Server> api_;
  std::unique_ptr<HttpEndpoint> metrics_;
  int port_ = 0;

  Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string running_id_ ABSL_GUARDED_BY(mu_);
  Server* running_ ABSL_GUARDED_BY(mu_) = nullptr;  // the running job's server
  // The running job's rounds committed since it (re)started, and when; its last round's
  // wall time: what its end is forecast from.
  std::vector<std::pair<int64_t, int64_t>> commits_ ABSL_GUARDED_BY(mu_);
  double last_wall_s_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread runner_;
};

}  // namespace cleave
