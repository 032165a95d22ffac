#include "service/pool_member.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "cleave/v1/pool.grpc.pb.h"
#include "core/clock.h"
#include "privacy/tls.h"
#include "service/site_policy.h"

namespace cleave {

struct PoolMember::Job {
  int port = 0;
  std::unique_ptr<Client> client;
  std::thread thread;
  bool ended = false;  // guarded by the member's mutex
};

PoolMember::PoolMember(PoolMemberOptions options) : opts_(std::move(options)) {}

PoolMember::~PoolMember() {
  Stop();
  DropEnded();
}

void PoolMember::Stop() {
  MutexLock l(&mu_);
  stopped_ = true;
  if (ctx_ != nullptr) ctx_->TryCancel();
  for (const auto& [id, job] : jobs_) job->client->Stop();
  cv_.SignalAll();
}

Status PoolMember::Run() {
  using SteadyClock = std::chrono::steady_clock;
  const ClientOptions& c = opts_.client;
  if (UsageLedger::Limits(opts_.policy)) {
    const std::string path = c.state_dir.empty() ? "" : (std::filesystem::path(c.state_dir) / "usage.ledger").string();
    StatusOr<UsageLedger> ledger = UsageLedger::Open(path, opts_.policy);
    if (!ledger.ok()) return ledger.status();
    MutexLock l(&mu_);
    ledger_ = *std::move(ledger);
  }
  double backoff = c.initial_backoff_s;
  auto reached = SteadyClock::now();
  for (;;) {
    Status s = Attach();
    DropEnded();
    MutexLock l(&mu_);
    if (stopped_) break;
    if (RetryCannotHelp(s.code())) {  // stop every job's client, as a signal would
      for (const auto& [id, job] : jobs_) job->client->Stop();
      if (s.code() == absl::StatusCode::kUnimplemented) {
        s = absl::UnimplementedError(absl::StrCat(c.server, " serves no pool: --stay attaches to cleave-server "
                                                  "--daemon's --clients-listen (",
                                                  s.message(), ")"));
      }
      stopped_ = true;
      refused_ = s;
      break;
    }
    if (s.ok()) {
      reached = SteadyClock::now();
      backoff = c.initial_backoff_s;
    }
    const double away = std::chrono::duration<double>(SteadyClock::now() - reached).count();
    if (away > c.give_up_after_s) {
      return absl::UnavailableError(absl::StrCat("the daemon's pool at ", c.server, " unreachable for ",
                                                 static_cast<int64_t>(away), " s: ", s.ToString()));
    }
    spdlog::warn("pool {}: {}; attaching again in {:.1f} s", c.server, s.ToString(), backoff);
    const auto until = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                                std::chrono::duration<double>(backoff));
    while (!stopped_ && SteadyClock::now() < until) cv_.WaitUntil(&mu_, until);
    backoff = std::min(backoff * 2, c.max_backoff_s);
  }
  // Stopped: every job's client was stopped; wait for them.
  std::map<std::string, std::unique_ptr<Job>> jobs;
  {
    MutexLock l(&mu_);
    jobs.swap(jobs_);
  }
  for (auto& [id, job] : jobs) job->thread.join();
  MutexLock l(&mu_);
  return refused_.ok() ? absl::CancelledError("stopped") : refused_;
}

v1::PoolHello PoolMember::Hello() {
  v1::PoolHello hello;
  hello.set_name(opts_.client.name);
  for (const auto& [name, data] : opts_.datasets) {
    v1::PoolDataset* d = hello.add_datasets();
    d->set_name(name);
    d->set_examples(data.train.size);
  }
  *hello.mutable_policy() = opts_.policy;
  MutexLock l(&mu_);
  for (const auto& [id, job] : jobs_) {
    if (job->ended) continue;
    v1::HeldJob* held = hello.add_jobs();
    held->set_job_id(id);
    held->set_port(job->port);
  }
  return hello;
}

Status PoolMember::Attach() {
  const ClientOptions& c = opts_.client;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  auto channel = grpc::CreateCustomChannel(c.server, ClientCredentials(c.tls_ca, c.tls_cert, c.tls_key, 60, c.token),
                                           args);
  auto stub = v1::Pool::NewStub(channel);
  grpc::ClientContext ctx;
  v1::PoolUp hello;
  *hello.mutable_hello() = Hello();
  std::unique_ptr<Stream> stream;
  {
    MutexLock l(&mu_);
    if (stopped_) return absl::CancelledError("stopped");
    ctx_ = &ctx;
    stream = stub->Attach(&ctx);
    stream_ = stream.get();
  }
  bool welcomed = false;
  Send(hello);
  if (auto pause = DuePause(/*always=*/true)) Send(*pause);
  for (v1::PoolDown down; stream->Read(&down);) {
    if (down.has_welcome()) {
      welcomed = true;
      spdlog::info("attached to the pool at {} as {}", c.server, down.welcome().name());
    } else if (down.has_offer()) {
      if (auto pause = DuePause(/*always=*/false)) Send(*pause);  // first: its decline is no refusal
      v1::PoolUp up;
      *up.mutable_answer() = Take(down.offer());
      Send(up);
    } else if (down.has_release()) {
      spdlog::info("released from {}: {}", down.release().job_id(), down.release().reason());
      Release(down.release().job_id());
    }
  }
  {
    MutexLock l(&mu_);
    ctx_ = nullptr;
    stream_ = nullptr;
  }
  const grpc::Status s = stream->Finish();
  if (welcomed) return absl::OkStatus();
  return Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message().empty() ? "the attachment ended"
                                                                                           : s.error_message());
}

v1::JobAnswer PoolMember::Take(const v1::JobOffer& offer) {
  v1::JobAnswer answer;
  answer.set_job_id(offer.job_id());
  v1::PoolHello site;
  for (const auto& [name, data] : opts_.datasets) site.add_datasets()->set_name(name);
  *site.mutable_policy() = opts_.policy;
  Status ok = SiteAccepts(site, offer.job());
  if (ok.ok()) ok = MayTrain();
  std::unique_ptr<Job> older;  // the job's run at another port (the daemon restarted): it ends first
  {
    MutexLock l(&mu_);
    auto it = jobs_.find(offer.job_id());
    if (it != jobs_.end() && it->second->port != offer.port()) {
      older = std::move(it->second);
      jobs_.erase(it);
      older->client->Stop();
    }
  }
  if (older) older->thread.join();
  DropEnded();
  MutexLock l(&mu_);
  if (jobs_.count(offer.job_id()) > 0) {  // offered again while it runs it
    answer.set_accepted(true);
    return answer;
  }
  if (ok.ok() && static_cast<int>(jobs_.size()) >= MaxConcurrentJobs(opts_.policy)) {
    ok = absl::ResourceExhaustedError(
        absl::StrCat("runs ", jobs_.size(), " job(s), its policy's max_concurrent_jobs"));
  }
  if (!ok.ok() || stopped_) {
    answer.set_reason(stopped_ ? "the client is stopping" : std::string(ok.message()));
    spdlog::info("declined {} ({} from {}): {}", offer.job_id(), offer.job().name(), offer.job().submitter(),
                 answer.reason());
    return answer;
  }
  const PoolMemberOptions::Data& data = opts_.datasets.at(DatasetOf(offer.job()));
  ClientOptions o = opts_.client;
  const std::string pool_host = o.server.substr(0, o.server.rfind(':'));
  o.server = absl::StrCat(offer.host().empty() ? pool_host : offer.host(), ":", offer.port());
  spdlog::info("joins {} ({} from {}) on dataset {}, at {}", offer.job_id(), offer.job().name(),
               offer.job().submitter(), DatasetOf(offer.job()), o.server);
  o.train = data.train;
  o.holdout = data.holdout;
  if (!o.state_dir.empty()) {
    o.state_dir = (std::filesystem::path(o.state_dir) / "jobs" / offer.job_id()).string();
    std::error_code ec;
    std::filesystem::create_directories(o.state_dir, ec);
  }
  // Until the daemon releases it: a job's server that is gone is the pool's to say.
  o.give_up_after_s = std::numeric_limits<double>::infinity();
  o.may_train = [this] { return MayTrain(); };
  o.trained = [this](double seconds) { Trained(seconds); };
  auto job = std::make_unique<Job>();
  Job* j = job.get();
  j->port = offer.port();
  j->client = std::make_unique<Client>(std::move(o));
  const std::string id = offer.job_id();
  j->thread = std::thread([this, j, id] {
    const Status s = j->client->Run();
    spdlog::info("{} ended here: {}", id, s.ToString());
    v1::PoolUp up;
    up.mutable_left()->set_job_id(id);
    up.mutable_left()->set_status(s.ok() ? "OK" : s.ToString());
    up.mutable_left()->set_port(j->port);
    {
      MutexLock l(&mu_);
      j->ended = true;
    }
    Send(up);
  });
  jobs_[id] = std::move(job);
  answer.set_accepted(true);
  return answer;
}

void PoolMember::Release(const std::string& id) {
  std::unique_ptr<Job> job;
  {
    MutexLock l(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    it->second->client->Stop();
    job = std::move(it->second);
    jobs_.erase(it);
  }
  // Its seat is free once its client ended, before the next message is read: the
  // scheduler releases a client from one job and offers it another at once, and the
  // offer must not find the seat still taken (nor two jobs train at once).
  job->thread.join();
}

void PoolMember::Send(const v1::PoolUp& up) {
  MutexLock l(&mu_);
  if (stream_ != nullptr && !stream_->Write(up)) ctx_->TryCancel();
}

void PoolMember::DropEnded() {
  std::vector<std::unique_ptr<Job>> ended;
  {
    MutexLock l(&mu_);
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      if (it->second->ended) {
        ended.push_back(std::move(it->second));
        it = jobs_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& job : ended) job->thread.join();
}

Status PoolMember::MayTrain() {
  MutexLock l(&mu_);
  if (!ledger_) return absl::OkStatus();
  const UsageLedger::Pause p = ledger_->PausedAt(UnixNowMs());
  if (p.until_ms == 0) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(p.reason, "; it trains again at ", UnixMsText(p.until_ms), " UTC"));
}

void PoolMember::Trained(double seconds) {
  {
    MutexLock l(&mu_);
    if (!ledger_) return;
    if (Status s = ledger_->Record(UnixNowMs(), seconds); !s.ok()) spdlog::error("the usage ledger: {}", s.ToString());
  }
  std::optional<v1::PoolUp> pause = DuePause(/*always=*/false);
  if (!pause) return;
  Send(*pause);  // first: the departures that follow are no refusals
  MutexLock l(&mu_);
  for (const auto& [id, job] : jobs_) job->client->Stop();  // it leaves every job until the limit frees
}

std::optional<v1::PoolUp> PoolMember::DuePause(bool always) {
  MutexLock l(&mu_);
  if (!ledger_) return std::nullopt;
  const UsageLedger::Pause p = ledger_->PausedAt(UnixNowMs());
  if (p.until_ms == 0 || (!always && p.until_ms == pause_told_)) return std::nullopt;
  pause_told_ = p.until_ms;
  spdlog::info("pauses until {} UTC: {}", UnixMsText(p.until_ms), p.reason);
  v1::PoolUp up;
  up.mutable_pause()->set_until_unix_ms(p.until_ms);
  up.mutable_pause()->set_reason(p.reason);
  return up;
}

std::string PoolMember::MetricsText() {
  MutexLock l(&mu_);
  for (const auto& [id, job] : jobs_) {
    if (!job->ended) return ClientMetricsText(job->client->State());
  }
  return "";
}

}  // namespace cleave
