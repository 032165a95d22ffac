#include "service/daemon.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/files.h"
#include "core/http_endpoint.h"
#include "core/memory.h"
#include "core/prometheus.h"
#include "core/printable.h"
#include "job/job.h"
#include "privacy/tls.h"
#include "server/server.h"
#include "service/dashboard.h"
#include "service/job_service.h"
#include "service/pool.h"
#include "service/scheduler.h"
#include "service/site_policy.h"

namespace cleave {
namespace {

// The credentials of a port: TLS with the daemon's certificate, a client certificate
// verified against the CA when one is given (`request`: asked for or required), or
// plaintext with --insecure (`what` travels in plaintext, says the warning).
StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const DaemonOptions& o, const char* what,
                                                               grpc_ssl_client_certificate_request_type request) {
  if (o.tls_cert.empty()) {
    if (!o.insecure) {
      return absl::InvalidArgumentError("no TLS certificate (--tls-cert, --tls-key); --insecure serves plaintext");
    }
    spdlog::warn("--insecure: {} travel in plaintext", what);
    return grpc::InsecureServerCredentials();
  }
  ASSIGN_OR_RETURN(TlsMaterial m, ReadServerTls(o.tls_cert, o.tls_key, o.tls_ca));
  grpc::SslServerCredentialsOptions ssl(m.ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE : request);
  ssl.pem_root_certs = m.ca;
  ssl.pem_key_cert_pairs.push_back({m.key, m.cert_chain});
  return grpc::SslServerCredentials(ssl);
}

// The host to dial for a listening address: loopback for a wildcard.
std::string DialHost(const std::string& listen) {
  const std::string host = listen.substr(0, listen.rfind(':'));
  return host == "0.0.0.0" || host == "[::]" ? "127.0.0.1" : host;
}

}  // namespace

int64_t ForecastEnd(const std::vector<std::pair<int64_t, int64_t>>& commits, double last_wall_s, int64_t total) {
  if (commits.empty()) return 0;
  const auto& [first_round, first_ms] = commits[commits.size() - std::min<size_t>(commits.size(), kForecastPace + 1)];
  const auto& [last_round, last_ms] = commits.back();
  const double per_round_ms = last_round > first_round
                                  ? static_cast<double>(last_ms - first_ms) / static_cast<double>(last_round - first_round)
                                  : last_wall_s * 1000;
  return last_ms + static_cast<int64_t>(static_cast<double>(std::max<int64_t>(0, total - last_round)) * per_round_ms);
}

int64_t RoundsToTarget(const std::vector<std::pair<int64_t, double>>& accuracy, double target, int64_t total) {
  if (target <= 0 || accuracy.empty()) return total;
  const int64_t last = accuracy.back().first;
  if (accuracy.back().second >= target) return std::min(last, total);
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [round, acc] : accuracy) {
    if (round < 1 || !std::isfinite(acc)) continue;
    const double x = std::log(static_cast<double>(round));
    n += 1, sx += x, sy += acc, sxx += x * x, sxy += x * acc;
  }
  const double spread = n * sxx - sx * sx;
  if (n < 2 || !(spread > 0)) return total;
  const double slope = (n * sxy - sx * sy) / spread, intercept = (sy - slope * sx) / n;
  if (!(slope > 0)) return total;
  const double round = std::ceil(std::exp((target - intercept) / slope));
  if (!std::isfinite(round) || round >= static_cast<double>(total)) return total;
  return std::max(last + 1, static_cast<int64_t>(round));
}

std::string DaemonMetricsText(const std::vector<JobRecord>& jobs, int64_t resident_bytes) {
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
  const std::vector<const JobRecord*> shown = ShownJobs(jobs);
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

// A running job: its server (on a port of its own), the thread that runs it, what the
// pool's clients decide on, and its progress.
struct Daemon::RunningJob {
  JobRecord record;
  v1::JobSummary summary;
  int min_clients = 1, max_clients = 0;
  double target_accuracy = 0;  // run.target_accuracy
  std::unique_ptr<Server> server;
  int port = 0;
  std::thread thread;
  // Guarded by the daemon's mutex.
  bool done = false;
  std::pair<JobState, std::string> end;  // once done
  std::string no_client;                 // why no attached client takes it (it is stopped)
  // Its rounds committed since it (re)started, and when; its last round's wall time:
  // what its end is forecast from.
  std::vector<std::pair<int64_t, int64_t>> commits;
  double last_wall_s = 0;
  // The scheduling loop's own: the declines already in the store.
  std::set<std::string> recorded;
  NoiseScaleAverage noise;  // its rounds' update noise (--scheduler goodput)
};

namespace {

// What a site's policy decides on, from a job's config; `parameters` 0 before its model
// exists.
v1::JobSummary Summarize(const std::string& submitter, const JobConfig& c, int64_t parameters) {
  v1::JobSummary s;
  s.set_name(c.run.name);
  s.set_submitter(submitter);
  s.set_dataset(c.data.dataset);
  s.set_model(c.model.name);
  s.set_parameters(parameters);
  s.set_rounds(c.run.rounds);
  s.set_secure_aggregation(c.secure_aggregation.enabled);
  s.set_dp(c.dp.enabled);
  s.set_dp_epsilon(c.dp.enabled ? c.dp.target_epsilon : 0);
  return s;
}

// "a: why; b: why", at most 10 clients named.
std::string Reasons(const std::map<std::string, std::string>& why) {
  std::string out;
  size_t n = 0;
  for (const auto& [client, reason] : why) {
    if (n++ == 10) return absl::StrCat(out, "; and ", why.size() - 10, " more");
    absl::StrAppend(&out, out.empty() ? "" : "; ", client, ": ", reason);
  }
  return out;
}

}  // namespace

Daemon::Daemon(DaemonOptions options) : opts_(std::move(options)) {}

StatusOr<std::unique_ptr<Daemon>> Daemon::Start(DaemonOptions options) {
  namespace fs = std::filesystem;
  if (options.state_dir.empty()) return absl::InvalidArgumentError("--state-dir is required");
  if (options.policy.empty()) return absl::InvalidArgumentError("--policy is required");
  if (options.clients_listen.empty()) return absl::InvalidArgumentError("--clients-listen is required");
  if (options.max_running < 1) return absl::InvalidArgumentError("--max-running is at least 1");
  if (options.job_port_lo < 0 || options.job_port_hi > 65535 || options.job_port_lo > options.job_port_hi ||
      (options.job_port_lo == 0) != (options.job_port_hi == 0)) {
    return absl::InvalidArgumentError("--job-ports LO-HI: 1 <= LO <= HI <= 65535");
  }
  RETURN_IF_ERROR(PoolSchedulerNames().Check(options.scheduler));
  std::error_code ec;
  fs::create_directories(fs::path(options.state_dir) / "jobs", ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("cannot create ", options.state_dir, ": ", ec.message()));
  std::unique_ptr<Daemon> d(new Daemon(std::move(options)));
  const DaemonOptions& o = d->opts_;
  d->scheduler_ = MakePoolScheduler(o.scheduler);
  ASSIGN_OR_RETURN(d->store_, JobStore::Open((fs::path(o.state_dir) / "jobs.db").string(), o.max_queued));
  ASSIGN_OR_RETURN(d->policy_, PolicyFile::Open(o.policy));
  // The API: a certificate's CN or a bearer token names the caller.
  ASSIGN_OR_RETURN(auto credentials, Credentials(o, "the job API and its bearer tokens",
                                                 GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY));
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
  // The pool: every client presents a certificate (its CN is its name).
  ASSIGN_OR_RETURN(auto pool_credentials,
                   Credentials(o, "the clients' pool and its hellos",
                               GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY));
  d->pool_ = std::make_unique<PoolService>([daemon = d.get()] { daemon->Changed(); });
  grpc::ServerBuilder pool;
  pool.AddListeningPort(o.clients_listen, pool_credentials, &d->pool_port_);
  pool.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  pool.RegisterService(d->pool_.get());
  pool.SetMaxReceiveMessageSize(1 << 20);
  d->pool_server_ = pool.BuildAndStart();
  if (d->pool_server_ == nullptr || d->pool_port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", o.clients_listen, " (--clients-listen)"));
  }
  // Where to reach the API and the pool, as a job's server.addr says where its port is.
  RETURN_IF_ERROR(WriteFileAtomic((fs::path(o.state_dir) / "daemon.addr").string(),
                                  absl::StrCat(DialHost(o.listen), ":", d->port_, "\n")));
  RETURN_IF_ERROR(WriteFileAtomic((fs::path(o.state_dir) / "pool.addr").string(),
                                  absl::StrCat(DialHost(o.clients_listen), ":", d->pool_port_, "\n")));
  spdlog::info("job API on port {}; the clients' pool on port {} ({} scheduler, up to {} jobs at once); state in {}",
               d->port_, d->pool_port_, o.scheduler, o.max_running, o.state_dir);
  if (!o.metrics_listen.empty()) {
    std::map<std::string, HttpEndpoint::Page> pages;
    pages["/metrics"] = {"text/plain; version=0.0.4; charset=utf-8",
                         [daemon = d.get()] { return DaemonMetricsText(daemon->LiveJobs(), ResidentBytes()); }};
    pages["/"] = {"text/html; charset=utf-8", [daemon = d.get()] {
                    return DaemonDashboardHtml(daemon->LiveJobs(), daemon->pool_->Members(), ResidentBytes());
                  }};
    ASSIGN_OR_RETURN(d->metrics_, HttpEndpoint::Start("--metrics-listen", o.metrics_listen, o.tls_cert, o.tls_key,
                                                      "--tls-cert and --tls-key", std::move(pages)));
  }
  d->runner_ = std::thread([daemon = d.get()] { daemon->RunJobs(); });
  return d;
}

int Daemon::metrics_port() const { return metrics_ ? metrics_->port() : 0; }

Daemon::~Daemon() {
  Stop();
  if (runner_.joinable()) runner_.join();
  if (pool_server_) pool_server_->Shutdown(std::chrono::system_clock::now());
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
    for (const auto& [id, job] : running_) job->server->Stop();
    cv_.SignalAll();
  }
  if (pool_) pool_->Shutdown();
  if (api_) api_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void Daemon::Changed() {
  MutexLock l(&mu_);
  changed_ = true;
  cv_.SignalAll();
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

Status Daemon::Admit(const std::string& who, const JobConfig& config) {
  const v1::JobSummary job = Summarize(who, config, 0);
  const std::vector<PoolMemberView> members = pool_->Members();
  if (members.empty()) {
    return absl::FailedPreconditionError("no client is attached to the daemon's pool: none could take the job");
  }
  std::map<std::string, std::string> why;
  for (const PoolMemberView& m : members) {
    const Status s = SiteAccepts(m.hello, job);
    if (s.ok()) return absl::OkStatus();
    why[m.name] = std::string(s.message());
  }
  return absl::FailedPreconditionError(absl::StrCat("no attached client would accept the job: ", Reasons(why)));
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
  if (Status s = Admit(who, config); !s.ok()) {
    AuditRefusal({0, who, "submit", "", Sha256Hex(yaml), "refused: no client would accept it"});
    return s;
  }
  ASSIGN_OR_RETURN(JobRecord job, store_->Submit(who, config.run.name, yaml, config.run.rounds, config.run.priority));
  spdlog::info("{} submitted {} ({}), {}", who, job.id, job.name, job.digest.substr(0, 12));
  Changed();
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
  if (auto it = running_.find(cancelled.id); it != running_.end()) it->second->server->Stop();
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

std::vector<JobRecord> Daemon::LiveJobs() {
  std::vector<JobRecord> jobs = store_->List();
  for (JobRecord& j : jobs) j = Live(std::move(j));
  return jobs;
}

JobRecord Daemon::Live(JobRecord j) {
  MutexLock l(&mu_);
  auto it = running_.find(j.id);
  if (it == running_.end()) return j;
  const RunningJob& r = *it->second;
  j.committed_round = r.server->committed_round();
  std::vector<std::pair<int64_t, double>> accuracy;
  for (const RoundMetrics& m : r.server->History()) {
    if (m.evaluation_only || !m.evaluated) continue;
    j.evaluated = true;
    j.accuracy = m.test_accuracy;
    j.loss = m.test_loss;
    accuracy.emplace_back(m.round, m.test_accuracy);
  }
  j.expected_end_ms =
      ForecastEnd(r.commits, r.last_wall_s, RoundsToTarget(accuracy, r.target_accuracy, j.total_rounds));
  return j;
}

void Daemon::RunJobs() {
  for (;;) {
    {
      MutexLock l(&mu_);
      // A pass every second besides the changes: a cancel or a policy's verdict may
      // need one.
      const auto next = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (!stopping_ && !changed_ && std::chrono::steady_clock::now() < next) cv_.WaitUntil(&mu_, next);
      if (stopping_) break;
      changed_ = false;
    }
    Reap();
    StartQueued();
    Schedule();
  }
  // Stopping: every job's server was stopped; each stays running in the store, to resume.
  std::map<std::string, std::unique_ptr<RunningJob>> jobs;
  {
    MutexLock l(&mu_);
    jobs.swap(running_);
  }
  for (auto& [id, job] : jobs) {
    job->thread.join();
    const auto& [state, reason] = job->end;
    if (state == JobState::kRunning) continue;
    if (Status s = store_->Finish(id, state, reason); !s.ok()) spdlog::error("{}", s.ToString());
  }
}

void Daemon::Reap() {
  std::vector<std::unique_ptr<RunningJob>> ended;
  {
    MutexLock l(&mu_);
    for (auto it = running_.begin(); it != running_.end();) {
      if (!it->second->done) {
        ++it;
        continue;
      }
      ended.push_back(std::move(it->second));
      it = running_.erase(it);
    }
  }
  for (auto& job : ended) {
    job->thread.join();
    const auto& [state, reason] = job->end;
    if (Status s = store_->Finish(job->record.id, state, reason); !s.ok()) spdlog::error("{}", s.ToString());
    for (const PoolMemberView& m : pool_->Members()) {
      if (m.jobs.count(job->record.id) > 0) pool_->Release(m.name, job->record.id, "the job ended");
    }
    pool_->Forget(job->record.id);
    spdlog::info("{} ({}) {}{}{}", job->record.id, job->record.name, JobStateName(state), reason.empty() ? "" : ": ",
                 reason);
  }
}

int Daemon::FreeJobPort() {
  if (opts_.job_port_lo == 0) return 0;
  std::set<int> taken;
  for (const auto& [id, r] : running_) taken.insert(r->port);
  for (int p = opts_.job_port_lo; p <= opts_.job_port_hi; ++p) {
    if (taken.count(p) == 0) return p;
  }
  return -1;
}

void Daemon::StartQueued() {
  for (;;) {
    StatusOr<JobRecord> next = absl::NotFoundError("");
    int port = 0;
    {
      MutexLock l(&mu_);
      if (stopping_ || opts_.paused || static_cast<int>(running_.size()) >= opts_.max_running) return;
      if ((port = FreeJobPort()) < 0) return;
      next = store_->StartNext();
      if (!next.ok()) return;
    }
    Launch(*next, port);
  }
}

void Daemon::Launch(const JobRecord& j, int port) {
  auto fail = [&](const std::string& why) {
    if (Status s = store_->Finish(j.id, JobState::kFailed, why); !s.ok()) spdlog::error("{}", s.ToString());
    spdlog::info("{} ({}) failed: {}", j.id, j.name, why);
  };
  const std::string dir = (std::filesystem::path(opts_.state_dir) / "jobs" / j.id).string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  StatusOr<JobConfig> config = ParseJob(j.config);
  if (!config.ok()) return fail(std::string(config.status().message()));
  // The daemon's TLS material, never files a job names (plaintext when it is --insecure).
  config->tls.cert = opts_.tls_cert;
  config->tls.key = opts_.tls_key;
  config->tls.ca = opts_.tls_ca;
  auto job = std::make_unique<RunningJob>();
  RunningJob* r = job.get();
  r->record = j;
  r->min_clients = config->clients.min_clients;
  r->max_clients = config->clients.per_round;
  r->target_accuracy = config->run.target_accuracy;
  ServerOptions o;
  o.config = *config;
  o.listen = absl::StrCat(opts_.clients_listen.substr(0, opts_.clients_listen.rfind(':')), ":", port);
  o.run_dir = dir;
  o.insecure = opts_.insecure && opts_.tls_cert.empty();
  o.config_text = j.config;
  o.measure_update_noise = opts_.scheduler == "goodput";
  o.committed = [this, r](const RoundMetrics& m) {
    MutexLock l(&mu_);
    r->commits.emplace_back(m.round, UnixNowMs());
    r->last_wall_s = m.wall_s;
    if (m.update_noise) r->noise.Add(m.update_noise->noise, m.update_noise->signal);
  };
  StatusOr<std::unique_ptr<Server>> server = Server::Create(std::move(o));
  if (!server.ok()) return fail(server.status().ToString());
  if (Status s = (*server)->Start(); !s.ok()) return fail(s.ToString());
  r->server = *std::move(server);
  r->port = r->server->port();
  r->summary = Summarize(j.submitter, *config, r->server->GlobalModel().total_elements());
  spdlog::info("{} ({}) starts, serving its clients on port {}", j.id, j.name, r->port);
  MutexLock l(&mu_);
  r->thread = std::thread([this, r] {
    // A cancel before it was in running_ found no server to stop.
    if (StatusOr<JobRecord> now = store_->Get(r->record.id); now.ok() && now->cancel_requested) r->server->Stop();
    const Status ran = r->server->Run();
    const JobRecord live = Live(r->record);
    if (Status s = store_->Progress(r->record.id, live.committed_round, live.evaluated, live.accuracy, live.loss);
        !s.ok()) {
      spdlog::error("{}", s.ToString());
    }
    StatusOr<JobRecord> now = store_->Get(r->record.id);
    MutexLock l(&mu_);
    if (now.ok() && now->cancel_requested) {
      r->end = {JobState::kCancelled, now->reason};
    } else if (ran.ok()) {
      r->end = {JobState::kSucceeded, ""};
    } else if (!r->no_client.empty()) {
      r->end = {JobState::kFailed, r->no_client};
    } else if (stopping_) {
      r->end = {JobState::kRunning, ""};  // resumed at the next start
    } else {
      r->end = {JobState::kFailed, ran.ToString()};
    }
    r->done = true;
    changed_ = true;
    cv_.SignalAll();
  });
  if (stopping_) r->server->Stop();
  running_[j.id] = std::move(job);
}

void Daemon::Schedule() {
  const std::vector<PoolMemberView> members = pool_->Members();
  std::map<std::string, int> ports;
  {
    MutexLock l(&mu_);
    for (const auto& [id, r] : running_) {
      if (!r->done) ports[id] = r->port;
    }
  }
  PoolAllocation current;
  const int64_t now = UnixNowMs();
  for (const PoolMemberView& m : members) {
    for (const auto& [id, held] : m.jobs) {
      auto it = ports.find(id);
      if (m.PausedAt(now)) {  // its daily limit is spent: it leaves every job until it frees
        pool_->Release(m.name, id, "the client paused until " + UnixMsText(m.paused_until_ms) + " UTC");
      } else if (it != ports.end() && it->second == held.port) {
        current[id].insert(m.name);
      } else {  // a job that ended, or one it ran before the daemon restarted
        pool_->Release(m.name, id, "the job is not running there");
      }
    }
  }
  std::vector<PoolSeat> seats;
  for (const PoolMemberView& m : members) {
    if (!m.PausedAt(now)) seats.push_back({m.name, MaxConcurrentJobs(m.hello.policy())});
  }
  std::map<std::string, v1::JobOffer> offers;
  std::vector<PoolJob> jobs;
  {
    MutexLock l(&mu_);
    jobs = Schedulable(members, current, &offers);
    const Slowness fit = RelativeSlowness(task_seconds_);
    for (PoolSeat& s : seats) {
      if (auto it = fit.clients.find(s.name); it != fit.clients.end()) s.slowness = it->second;
    }
    for (PoolJob& j : jobs) {
      if (auto it = fit.unit_s.find(j.id); it != fit.unit_s.end()) j.unit_s = it->second;
    }
  }
  const PoolAllocation next = scheduler_->Allocate(jobs, seats, current);
  for (const auto& [id, clients] : current) {
    for (const std::string& c : clients) {
      if (next.count(id) == 0 || next.at(id).count(c) == 0) pool_->Release(c, id, "the scheduler gave it another job");
    }
  }
  for (const auto& [id, clients] : next) {
    for (const std::string& c : clients) {
      if (current.count(id) == 0 || current.at(id).count(c) == 0) pool_->Offer(c, offers.at(id));
    }
  }
}

std::vector<PoolJob> Daemon::Schedulable(const std::vector<PoolMemberView>& members, const PoolAllocation& current,
                                         std::map<std::string, v1::JobOffer>* offers) {
  std::vector<PoolJob> jobs;
  for (const auto& [id, r] : running_) {
    if (r->done || !r->no_client.empty()) continue;
    PoolJob job{id, r->record.priority, JobNumber(id), r->min_clients, r->max_clients, {}, r->noise.value()};
    double slowest_task = 0;  // its round's time besides training: its last round's wall time less this
    for (const auto& [client, seconds] : r->server->ClientTaskSeconds()) {
      task_seconds_[{id, client}] = seconds;
      slowest_task = std::max(slowest_task, seconds);
    }
    job.overhead_s = std::max(0.0, r->last_wall_s - slowest_task);
    const std::map<std::string, std::string> declined = pool_->Declines(id);
    for (const auto& [client, reason] : declined) {
      // A client that left the job after its end ("") declined nothing.
      if (!reason.empty() && r->recorded.insert(client).second) {
        if (Status s = store_->Decline(id, client, reason); !s.ok()) spdlog::error("{}", s.ToString());
      }
    }
    std::map<std::string, std::string> why;
    bool ending = false;  // a client left it after its end
    for (const auto& [client, reason] : declined) ending |= reason.empty();
    bool waits = false;  // for a client that accepts it but pauses now
    for (const PoolMemberView& m : members) {
      if (declined.count(m.name) > 0) {
        why[m.name] = declined.at(m.name);
      } else if (Status s = SiteAccepts(m.hello, r->summary); !s.ok()) {
        // Refused by the policy the site sent: it is not offered the job, and declined it.
        why[m.name] = std::string(s.message());
        if (r->recorded.insert(m.name).second) {
          if (Status st = store_->Decline(id, m.name, why[m.name]); !st.ok()) spdlog::error("{}", st.ToString());
        }
      } else if (m.PausedAt(UnixNowMs())) {
        waits = true;
      } else {
        job.eligible.insert(m.name);
      }
    }
    if (!members.empty() && job.eligible.empty() && current.count(id) == 0 && !ending && !waits) {
      r->no_client = "no attached client accepts the job: " + Reasons(why);
      r->server->Stop();
      continue;
    }
    jobs.push_back(std::move(job));
    v1::JobOffer& offer = (*offers)[id];
    offer.set_job_id(id);
    offer.set_host(opts_.advertise_host);
    offer.set_port(r->port);
    *offer.mutable_job() = r->summary;
  }
  // The clients' times in the last kTimedJobs jobs: enough to compare clients the
  // scheduler has since parted (RelativeSlowness), bounded.
  std::set<int64_t> timed;
  for (const auto& [key, seconds] : task_seconds_) timed.insert(JobNumber(key.first));
  while (timed.size() > kTimedJobs) {
    const int64_t oldest = *timed.begin();
    timed.erase(timed.begin());
    for (auto it = task_seconds_.begin(); it != task_seconds_.end();) {
      it = JobNumber(it->first.first) == oldest ? task_seconds_.erase(it) : std::next(it);
    }
  }
  return jobs;
}

}  // namespace cleave
