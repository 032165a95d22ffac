// Daemon: a long-running cleave-server (cleave-server --daemon) that runs the jobs its
// users submit, several at once, over a pool of clients that stay installed
// (cleave-client --stay). It owns the job store (service/job_store.h), the policy file
// (service/access_policy.h), the job API (proto/cleave/v1/jobs.proto,
// service/job_service.cc) on its own port, and the pool (service/pool.h) on the clients'
// port. Each running job is a Server (server/server.h) on a port of its own, with its run
// directory under the state directory (STATE_DIR/jobs/ID); a scheduling pass
// (service/scheduler.h) decides which attached clients each job is offered. Stopping the
// daemon stops the running jobs after their last committed rounds; the next start
// resumes them from their checkpoints.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"
#include "service/access_policy.h"
#include "service/job_store.h"
#include "service/pool.h"
#include "service/scheduler.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace cleave {

class HttpEndpoint;  // core/http_endpoint.h
struct JobConfig;    // job/job.h
class JobService;    // service/job_service.h

struct DaemonOptions {
  std::string state_dir;       // jobs.db, daemon.addr and each job's run directory
  std::string listen;          // the job API's address (port 0: any free one)
  std::string clients_listen;  // the pool's address; each job serves its clients on this host, a port of its own
  // The host clients dial for a job (its offers' host); empty: the host they dialed for
  // the pool.
  std::string advertise_host;
  // The ports jobs listen on (inclusive; a job waits queued while every one is taken);
  // 0, 0: any free port.
  int job_port_lo = 0, job_port_hi = 0;
  std::string scheduler = "fifo";  // PoolSchedulerNames() (service/scheduler.h)
  int max_running = 4;             // jobs run at once
  std::string policy;          // the policy file
  // TLS of both ports: the server's certificate and key, and the CA that client
  // certificates chain to (mutual TLS for the jobs' clients when their tls.mutual
  // says so; optional on the job API, where a certificate's CN is its caller's identity).
  std::string tls_cert, tls_key, tls_ca;
  bool insecure = false;  // plaintext on both ports, when no certificate is given
  int max_queued = 100;
  size_t max_job_bytes = 1 << 20;  // the largest job file accepted
  bool paused = false;  // accept and queue jobs, start none (maintenance)
  // Where to serve /metrics (Prometheus) and the dashboard (/, service/dashboard.h):
  // plain HTTP on loopback only, else HTTPS with tls_cert; empty: nowhere.
  std::string metrics_listen;
};

// The daemon's /metrics: jobs by state, the process's resident memory, and per job
// (those queued or running, and the 20 that ended last, so labels stay bounded) its
// state, rounds, test accuracy and forecast end.
std::string DaemonMetricsText(const std::vector<JobRecord>& jobs, int64_t resident_bytes);

// When a job of `total` rounds is expected to end (Unix ms), from the rounds it committed
// in this run of it, each with its time (Unix ms), and the wall time of its last round
// (seconds): at the pace of its last kForecastPace rounds (their mean interval, so that
// the pace follows the clients the scheduler gives it; with one commit, its wall time).
// 0 before the first commit.
constexpr int kForecastPace = 5;
int64_t ForecastEnd(const std::vector<std::pair<int64_t, int64_t>>& commits, double last_wall_s, int64_t total);

// The round a job that ends at run.target_accuracy `target` is expected to end at, from
// its evaluated rounds' test accuracy ((round, accuracy), in order): where the least-
// squares line of accuracy against ln(round) reaches the target, within (its last
// evaluated round, total]; its last evaluated round once it reached the target; `total`
// without a target, with fewer than two evaluated rounds, or when accuracy does not rise.
int64_t RoundsToTarget(const std::vector<std::pair<int64_t, double>>& accuracy, double target, int64_t total);

class Daemon {
 public:
  static StatusOr<std::unique_ptr<Daemon>> Start(DaemonOptions options);
  ~Daemon();

  int port() const { return port_; }
  int pool_port() const { return pool_port_; }
  int metrics_port() const;
  // Blocks until Stop.
  void Wait();
  // Stops the job API, the pool and the running jobs (they resume at the next start). Any
  // thread.
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
  // Whether some attached client would accept `config` from `who`: FAILED_PRECONDITION
  // with each client's reason when none would.
  Status Admit(const std::string& who, const JobConfig& config);
  // The scheduling loop: on every change, ends the jobs that finished, starts queued
  // ones and divides the pool among the running ones.
  void RunJobs();
  // The running jobs that finished: their end in the store, their clients released, their
  // servers freed.
  void Reap() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts queued jobs while fewer than max_running run.
  void StartQueued() ABSL_LOCKS_EXCLUDED(mu_);
  // Starts job `j`'s server on `port` (0: any) and the thread that runs it; a job that
  // cannot start fails.
  void Launch(const JobRecord& j, int port) ABSL_LOCKS_EXCLUDED(mu_);
  // The lowest port of job_port_lo..hi no running job holds; 0 without a range, -1 when
  // every one is taken.
  int FreeJobPort() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Divides the attached clients among the running jobs, offering and releasing.
  void Schedule() ABSL_LOCKS_EXCLUDED(mu_);
  // The running jobs as the scheduler sees them, each with its offer, given the
  // attached clients and the jobs they hold (`current`). Records new declines; stops a
  // job no attached client accepts.
  std::vector<PoolJob> Schedulable(const std::vector<PoolMemberView>& members, const PoolAllocation& current,
                                   std::map<std::string, v1::JobOffer>* offers) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The record with its running job's live progress.
  JobRecord Live(JobRecord j) ABSL_LOCKS_EXCLUDED(mu_);
  // Every job, each Live.
  std::vector<JobRecord> LiveJobs() ABSL_LOCKS_EXCLUDED(mu_);
  // Wakes the scheduling loop.
  void Changed() ABSL_LOCKS_EXCLUDED(mu_);

  struct RunningJob;

  const DaemonOptions opts_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<PolicyFile> policy_;
  std::unique_ptr<PoolScheduler> scheduler_;
  std::unique_ptr<JobService> service_;  // outlives api_, which serves it
  std::unique_ptr<PoolService> pool_;    // outlives pool_server_
  std::unique_ptr<grpc::Server> api_, pool_server_;
  std::unique_ptr<HttpEndpoint> metrics_;
  int port_ = 0, pool_port_ = 0;

  Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool changed_ ABSL_GUARDED_BY(mu_) = true;  // the scheduling loop has work
  // The running jobs by id; added and removed by the scheduling loop only.
  std::map<std::string, std::unique_ptr<RunningJob>> running_ ABSL_GUARDED_BY(mu_);
  // Each client's last round time in each job (job id, client), for --scheduler goodput.
  std::map<std::pair<std::string, std::string>, double> task_seconds_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kTimedJobs = 32;
  std::thread runner_;
};

}  // namespace cleave
