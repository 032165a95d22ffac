#include "service/daemon.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "core/http_endpoint.h"
#include "core/memory.h"
#include "core/prometheus.h"
#include "core/printable.h"
#include "job/job.h"
#include "privacy/tls.h"
#include "server/server.h"
#include "service/job_service.h"

namespace cleave {
namespace {

// The API's credentials: TLS with the daemon's certificate (a client certificate asked
// for and verified when a CA is given, not required: tokens authenticate too), or
// plaintext with --insecure.
StatusOr<std::shared_ptr<grpc::ServerCredentials>> ApiCredentials(const DaemonOptions& o) {
  if (o.tls_cert.empty()) {
    if (!o.insecure) {
      return absl::InvalidArgumentError("no TLS certificate (--tls-cert, --tls-key); --insecure serves plaintext");
    }
    spdlog::warn("--insecure: the job API and its bearer tokens travel in plaintext");
    return grpc::InsecureServerCredentials();
  }
  ASSIGN_OR_RETURN(TlsMaterial m, ReadServerTls(o.tls_cert, o.tls_key, o.tls_ca));
  grpc::SslServerCredentialsOptions ssl(m.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                                     : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = m.ca;
  ssl.pem_key_cert_pairs.push_back({m.key, m.cert_chain});
  return grpc::SslServerCredentials(ssl);
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int64_t ForecastEnd(const std::vector<std::pair<int64_t, int64_t>>& commits, double last_wall_s, int64_t total) {
  if (commits.empty()) return 0;
  const auto& [first_round, first_ms] = commits.front();
  const auto& [last_round, last_ms] = commits.back();
  const double per_round_ms = last_round > first_round
                                  ? static_cast<double>(last_ms - first_ms) / static_cast<double>(last_round - first_round)
                                  : last_wall_s * 1000;
  return last_ms + static_cast<int64_t>(static_cast<double>(std::max<int64_t>(0, total - last_round)) * per_round_ms);
}

std::string DaemonMetricsText(const std::vector<JobRecord>& jobs, int64_t resident_bytes) {
  constexpr size_t kEndedShown = 20;
  prometheus::Exposition out;
  std::map<JobState, int> by_state;
  for (JobState s : {JobState::kQueued, JobState::kRunning, JobState::kSucceeded, JobState::kFailed,
                     JobState::kCancelled}) {
    by_state[s] = 0;
  }
  for (const JobRecord& j : jobs) ++by_state[j.state];
  out.Family("cleave_daemon_jobs", "gauge", "Jobs in the daemon's store, by state.");
  for (const auto& [state, n] : by_state) {
    out.Sample("cleave_daemon_jobs", n, absl::StrCat("state=\"", JobStateName(state), "\""));
  }
  out.Gauge("cleave_daemon_resident_bytes", "The daemon process's resident memory.",
            static_cast<double>(resident_bytes));
  // The jobs shown: every queued or running one, and the last kEndedShown that ended.
  std::vector<const JobRecord*> shown;
  size_t ended = 0;
  for (auto it = jobs.rbegin(); it != jobs.rend(); ++it) {
    if (!JobEnded(it->state) || ended++ < kEndedShown) shown.push_back(&*it);
  }
  auto labels = [](const JobRecord& j) {
    return absl::StrCat("job=\"", prometheus::Label(j.id), "\",name=\"", prometheus::Label(j.name), "\"");
  };
  out.Family("cleave_job_info", "gauge", "1 for each job shown, its state and submitter as labels.");
  for (const JobRecord* j : shown) {
    out.Sample("cleave_job_info", 1,
               absl::StrCat(labels(*j), ",state=\"", JobStateName(j->state), "\",submitter=\"",
                            prometheus::Label(j->submitter), "\""));
  }
  out.Family("cleave_job_committed_rounds", "gauge", "Rounds the job committed.");
  for (const JobRecord* j : shown) out.Sample("cleave_job_committed_rounds", j->committed_round, labels(*j));
  out.Family("cleave_job_rounds", "gauge", "Rounds the job runs (run.rounds).");
  for (const JobRecord* j : shown) out.Sample("cleave_job_rounds", j->total_rounds, labels(*j));
  out.Family("cleave_job_test_accuracy", "gauge", "The job's last measured test accuracy.");
  for (const JobRecord* j : shown) {
    if (j->evaluated) out.Sample("cleave_job_test_accuracy", j->accuracy, labels(*j));
  }
  out.Family("cleave_job_expected_end_timestamp_seconds", "gauge", "A running job's forecast end (Unix time).");
  for (const JobRecord* j : shown) {
    if (j->expected_end_ms > 0) {
      out.Sample("cleave_job_expected_end_timestamp_seconds", static_cast<double>(j->expected_end_ms) / 1000,
                 labels(*j));
    }
  }
  return out.Take();
}

Daemon::Daemon(DaemonOptions options) : opts_(std::move(options)) {}

StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  namespace fs = std::filesystem;
  if (options.state_dir.empty()) return absl::InvalidArgumentError("--state-dir is required");
  if (options.policy.empty()) return absl::InvalidArgumentError("--policy is required");
  if (options.clients_listen.empty()) return absl::InvalidArgumentError("--clients-listen is required");
  std::error_code ec;
  fs::create_directories(fs::path(options.state_dir) / "jobs", ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("cannot create ", options.state_dir, ": ", ec.message()));
  std::unique_ptr<Daemon> d(new Daemon(std::move(options)));
  const DaemonOptions& o = d->opts_;
  ASSIGN_OR_RETURN(d->store_, JobStore::Open((fs::path(o.state_dir) / "jobs.db").string(), o.max_queued));
  ASSIGN_OR_RETURN(d->policy_, PolicyFile::Open(o.policy));
  ASSIGN_OR_RETURN(auto credentials, ApiCredentials(o));
  d->service_ = std::make_unique<JobService>(d.get());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, credentials, &d->port_);
  builder.RegisterService(d->service_.get());
  // Larger than the largest job, so that a job over it gets our error, not the transport's.
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::max<size_t>(4 << 20, o.max_job_bytes + (64 << 10))));
  d->api_ = builder.BuildAndStart();
  if (d->api_ == nullptr || d->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o.listen));
  }
  // Where to reach the API, as a job's server.addr says where its clients' port is.
  const std::string host = o.listen.substr(0, o.listen.rfind(':'));
  RETURN_IF_ERROR(WriteFileAtomic((fs::path(o.state_dir) / "daemon.addr").string(),
                                  absl::StrCat(host == "0.0.0.0" || host == "[::]" ? "127.0.0.1" : host, ":",
                                               d->port_, "\n")));
  spdlog::info("job API on port {}; jobs serve clients on {}; state in {}", d->port_, o.clients_listen,
               o.state_dir);
  if (!o.metrics_listen.empty()) {
    std::map<std::string, HttpEndpoint::Page> pages;
    pages["/metrics"] = {"text/plain; version=0.0.4; charset=utf-8", [daemon = d.get()] {
                           std::vector<JobRecord> jobs = daemon->store_->List();
                           for (JobRecord& j : jobs) j = daemon->Live(std::move(j));
                           return DaemonMetricsText(jobs, ResidentBytes());
                         }};
    ASSIGN_OR_RETURN(d->metrics_, HttpEndpoint::Start("--metrics-listen", o.metrics_listen, o.tls_cert, o.tls_key,
                                                      "--tls-cert and --tls-key", std::move(pages)));
  }
  if (!o.paused) d->runner_ = std::thread([daemon = d.get()] { daemon->RunJobs(); });
  return d;
}

int Daemon::metrics_port() const { return metrics_ ? metrics_->port() : 0; }

Daemon::~Daemon() {
  Stop();
  if (runner_.joinable()) runner_.join();
}

void Daemon::Wait() {
  MutexLock l(&mu_);
  while (!stopping_) cv_.Wait(&mu_);
}

void Daemon::Stop() {
  {
    MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    if (running_ != nullptr) running_->Stop();
    cv_.SignalAll();
  }
  if (api_) api_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

std::string Daemon::IdentityOfToken(const std::string& token) {
  return policy_->Current()->IdentityOfToken(token);
}

Status Daemon::Allowed(const std::string& who, Right right, const JobRecord* job) {
  std::shared_ptr<const AccessPolicy> policy = policy_->Current();
  if (policy->Has(who, right)) return absl::OkStatus();
  const bool own = job != nullptr && job->submitter == who && right != Right::kAdmin;
  if (own && policy->Has(who, Right::kSubmit)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(who, " may not ", RightName(right),
                                                  job ? " " + job->id : std::string(),
                                                  " (the daemon's policy file grants no such right)"));
}

void Daemon::AuditRefusal(const AuditEntry& e) {
  if (Status s = store_->Audit(e); !s.ok()) spdlog::error("audit log: {}", s.ToString());
}

StatusOr<JobRecord> Daemon::Submit(const std::string& who, const std::string& yaml) {
  if (Status s = Allowed(who, Right::kSubmit, nullptr); !s.ok()) {
    AuditRefusal({0, who, "submit", "", "", "refused: permission denied"});
    return s;
  }
  if (yaml.size() > opts_.max_job_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a job file of ", yaml.size(), " bytes; at most ", opts_.max_job_bytes));
  }
  ASSIGN_OR_RETURN(const JobConfig config, ParseJob(yaml));
  ASSIGN_OR_RETURN(JobRecord job, store_->Submit(who, config.run.name, yaml, config.run.rounds));
  spdlog::info("{} submitted {} ({}), {}", who, job.id, job.name, job.digest.substr(0, 12));
  MutexLock l(&mu_);
  cv_.SignalAll();
  return job;
}

StatusOr<std::vector<JobRecord>> Daemon::List(const std::string& who) {
  std::shared_ptr<const AccessPolicy> policy = policy_->Current();
  const bool all = policy->Has(who, Right::kRead);
  if (!all && !policy->Has(who, Right::kSubmit)) return Allowed(who, Right::kRead, nullptr);
  std::vector<JobRecord> out;
  for (JobRecord& j : store_->List()) {
    if (all || j.submitter == who) out.push_back(Live(std::move(j)));
  }
  return out;
}

StatusOr<JobRecord> Daemon::Get(const std::string& who, const std::string& id) {
  std::shared_ptr<const AccessPolicy> policy = policy_->Current();
  if (!policy->Has(who, Right::kRead) && !policy->Has(who, Right::kSubmit)) {
    return Allowed(who, Right::kRead, nullptr);
  }
  ASSIGN_OR_RETURN(JobRecord j, store_->Get(id));
  RETURN_IF_ERROR(Allowed(who, Right::kRead, &j));
  return Live(std::move(j));
}

StatusOr<JobRecord> Daemon::Cancel(const std::string& who, const std::string& id) {
  StatusOr<JobRecord> j = store_->Get(id);
  if (Status s = Allowed(who, Right::kCancel, j.ok() ? &*j : nullptr); !s.ok()) {
    AuditRefusal({0, who, "cancel", Printable(id), j.ok() ? j->digest : "", "refused: permission denied"});
    return s;
  }
  RETURN_IF_ERROR(j.status());
  ASSIGN_OR_RETURN(JobRecord cancelled, store_->Cancel(id, who));
  spdlog::info("{} cancelled {} ({})", who, cancelled.id, JobStateName(cancelled.state));
  MutexLock l(&mu_);
  if (running_ != nullptr && running_id_ == cancelled.id) running_->Stop();
  return cancelled;
}

StatusOr<std::string> Daemon::RunDirOf(const std::string& who, const std::string& id) {
  ASSIGN_OR_RETURN(JobRecord j, Get(who, id));
  return (std::filesystem::path(opts_.state_dir) / "jobs" / j.id).string();
}

StatusOr<std::vector<AuditEntry>> Daemon::AuditLog(const std::string& who) {
  RETURN_IF_ERROR(Allowed(who, Right::kAdmin, nullptr));
  return store_->AuditLog();
}

bool Daemon::Ended(const std::string& id) {
  StatusOr<JobRecord> j = store_->Get(id);
  return !j.ok() || JobEnded(j->state);
}

JobRecord Daemon::Live(JobRecord j) {
  MutexLock l(&mu_);
  if (running_ == nullptr || running_id_ != j.id) return j;
  j.committed_round = running_->committed_round();
  j.expected_end_ms = ForecastEnd(commits_, last_wall_s_, j.total_rounds);
  for (const RoundMetrics& m : running_->History()) {
    if (m.evaluation_only || !m.evaluated) continue;
    j.evaluated = true;
    j.accuracy = m.test_accuracy;
    j.loss = m.test_loss;
  }
  return j;
}

void Daemon::RunJobs() {
  for (;;) {
    StatusOr<JobRecord> next = absl::NotFoundError("");
    {
      MutexLock l(&mu_);
      while (!stopping_ && !(next = store_->StartNext()).ok()) cv_.Wait(&mu_);
      if (stopping_) return;  // a job just started stays running in the store: resumed next time
    }
    spdlog::info("{} ({}) starts", next->id, next->name);
    const auto [state, reason] = RunJob(*next);
    if (state == JobState::kRunning) return;  // the daemon stopped it
    if (Status s = store_->Finish(next->id, state, reason); !s.ok()) spdlog::error("{}", s.ToString());
    spdlog::info("{} ({}) {}{}{}", next->id, next->name, JobStateName(state), reason.empty() ? "" : ": ", reason);
  }
}

std::pair<JobState, std::string> Daemon::RunJob(const JobRecord& j) {
  const std::string dir = (std::filesystem::path(opts_.state_dir) / "jobs" / j.id).string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  StatusOr<JobConfig> config = ParseJob(j.config);
  if (!config.ok()) return {JobState::kFailed, std::string(config.status().message())};
  // The daemon's TLS material, never files a job names (plaintext when it is --insecure).
  config->tls.cert = opts_.tls_cert;
  config->tls.key = opts_.tls_key;
  config->tls.ca = opts_.tls_ca;
  ServerOptions o;
  o.config = *config;
  o.listen = opts_.clients_listen;
  o.run_dir = dir;
  o.insecure = opts_.insecure && opts_.tls_cert.empty();
  o.config_text = j.config;
  o.committed = [this](const RoundMetrics& m) {
    MutexLock l(&mu_);
    commits_.emplace_back(m.round, NowMs());
    last_wall_s_ = m.wall_s;
  };
  StatusOr<std::unique_ptr<Server>> server = Server::Create(std::move(o));
  if (!server.ok()) return {JobState::kFailed, server.status().ToString()};
  if (Status s = (*server)->Start(); !s.ok()) return {JobState::kFailed, s.ToString()};
  {
    MutexLock l(&mu_);
    if (stopping_) return {JobState::kRunning, ""};
    running_ = server->get();
    running_id_ = j.id;
    commits_.clear();
  }
  // A cancel between StartNext and now found no server to stop.
  if (StatusOr<JobRecord> now = store_->Get(j.id); now.ok() && now->cancel_requested) (*server)->Stop();
  const Status ran = (*server)->Run();
  const JobRecord live = Live(j);
  bool stopped = false;
  {
    MutexLock l(&mu_);
    running_ = nullptr;
    running_id_.clear();
    stopped = stopping_;
  }
  if (Status s = store_->Progress(j.id, live.committed_round, live.evaluated, live.accuracy, live.loss); !s.ok()) {
    spdlog::error("{}", s.ToString());
  }
  StatusOr<JobRecord> now = store_->Get(j.id);
  if (now.ok() && now->cancel_requested) return {JobState::kCancelled, now->reason};
  if (stopped) return {JobState::kRunning, ""};
  if (ran.ok()) return {JobState::kSucceeded, ""};
  return {JobState::kFailed, ran.ToString()};
}

}  // namespace cleave
