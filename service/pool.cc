#include "service/pool.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/grpc_status.h"
#include "core/printable.h"
#include "privacy/tls.h"

namespace cleave {
namespace {

constexpr size_t kMaxName = 128, kMaxDatasets = 64, kMaxHeld = 64, kMaxReason = 512;

Status CheckName(const std::string& what, const std::string& name) {
  if (name.empty() || name.size() > kMaxName || Printable(name) != name) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Printable(name.substr(0, kMaxName)), ": 1 to ", kMaxName, " printable characters"));
  }
  return absl::OkStatus();
}

}  // namespace

struct PoolService::Member {
  std::string name;
  grpc::ServerContext* ctx = nullptr;
  // Guarded by the pool's mutex.
  v1::PoolHello hello;
  std::map<std::string, PoolMemberView::Held> jobs;
  int64_t paused_until_ms = 0;
  std::string pause_reason;
  // Null once the attachment ended: nothing is written after.
  Mutex write_mu;
  grpc::ServerReaderWriter<v1::PoolDown, v1::PoolUp>* stream ABSL_GUARDED_BY(write_mu) = nullptr;
};

Status CheckPause(const v1::PoolPause& pause, int64_t now_ms) {
  constexpr int64_t kMostAhead = 25 * 3600 * 1000;  // a day's limit, and an hour of clock skew
  if (pause.until_unix_ms() != 0 &&
      (pause.until_unix_ms() < 0 || pause.until_unix_ms() > now_ms + kMostAhead)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pause until ", pause.until_unix_ms(), " (Unix ms): 0, or within 25 hours"));
  }
  if (pause.reason().size() > kMaxReason) {
    return absl::InvalidArgumentError(absl::StrCat("a pause's reason of ", pause.reason().size(), " bytes; at most ",
                                                   kMaxReason));
  }
  return absl::OkStatus();
}

Status CheckHello(const v1::PoolHello& hello) {
  if (!hello.name().empty()) RETURN_IF_ERROR(CheckName("client name", hello.name()));
  if (hello.datasets_size() > static_cast<int>(kMaxDatasets)) {
    return absl::InvalidArgumentError(absl::StrCat(hello.datasets_size(), " datasets; at most ", kMaxDatasets));
  }
  std::set<std::string> seen;
  for (const v1::PoolDataset& d : hello.datasets()) {
    RETURN_IF_ERROR(CheckName("dataset", d.name()));
    if (!seen.insert(d.name()).second) return absl::InvalidArgumentError("dataset " + d.name() + " named twice");
    if (d.examples() < 0) return absl::InvalidArgumentError("dataset " + d.name() + ": a negative size");
  }
  if (hello.jobs_size() > static_cast<int>(kMaxHeld)) {
    return absl::InvalidArgumentError(absl::StrCat(hello.jobs_size(), " jobs held; at most ", kMaxHeld));
  }
  for (const v1::HeldJob& j : hello.jobs()) RETURN_IF_ERROR(CheckName("job", j.job_id()));
  return absl::OkStatus();
}

grpc::Status PoolService::Attach(grpc::ServerContext* ctx,
                                 grpc::ServerReaderWriter<v1::PoolDown, v1::PoolUp>* stream) {
  v1::PoolUp first;
  if (!stream->Read(&first) || !first.has_hello()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a pool attachment starts with a hello");
  }
  if (Status s = CheckHello(first.hello()); !s.ok()) return ToGrpc(s);
  auto m = std::make_shared<Member>();
  m->name = PeerCommonName(*ctx);
  if (m->name.empty()) m->name = first.hello().name();
  if (m->name.empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no name: a client certificate or --name");
  }
  m->ctx = ctx;
  m->hello = first.hello();
  for (const v1::HeldJob& j : m->hello.jobs()) m->jobs[j.job_id()] = {true, j.port()};
  {
    MutexLock w(&m->write_mu);
    m->stream = stream;
  }
  {
    MutexLock l(&mu_);
    if (shutdown_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the daemon is stopping");
    auto& slot = members_[m->name];
    if (slot != nullptr) {
      spdlog::info("pool: {} attached again; its older attachment ends", m->name);
      slot->ctx->TryCancel();
    }
    slot = m;
  }
  v1::PoolDown welcome;
  welcome.mutable_welcome()->set_name(m->name);
  Write(m.get(), welcome);
  spdlog::info("pool: {} attached, {} dataset(s), {} job(s) held", m->name, m->hello.datasets_size(),
               m->hello.jobs_size());
  changed_();
  Status ended;
  for (v1::PoolUp up; ended.ok() && stream->Read(&up);) ended = Handle(m, up);
  {
    MutexLock w(&m->write_mu);
    m->stream = nullptr;
  }
  {
    MutexLock l(&mu_);
    if (auto it = members_.find(m->name); it != members_.end() && it->second == m) members_.erase(it);
  }
  spdlog::info("pool: {} detached{}", m->name, ended.ok() ? "" : ": " + ended.ToString());
  changed_();
  return ToGrpc(ended);
}

Status PoolService::Handle(const std::shared_ptr<Member>& m, const v1::PoolUp& up) {
  {
    MutexLock l(&mu_);
    if (up.has_answer()) {
      const v1::JobAnswer& a = up.answer();
      auto it = m->jobs.find(a.job_id());
      if (it == m->jobs.end()) return absl::OkStatus();  // released meanwhile
      if (a.accepted()) {
        it->second.accepted = true;
      } else {
        m->jobs.erase(it);
        const std::string reason = Printable(a.reason().substr(0, kMaxReason));
        // Declined for a pause: offered again once it ends.
        if (m->paused_until_ms <= UnixNowMs()) declines_[a.job_id()][m->name] = reason.empty() ? "declined" : reason;
        spdlog::info("pool: {} declined {}: {}", m->name, a.job_id(), reason);
      }
    } else if (up.has_left()) {
      const v1::JobLeft& left = up.left();
      auto it = m->jobs.find(left.job_id());
      if (it == m->jobs.end() || it->second.port != left.port()) return absl::OkStatus();  // an older run's
      m->jobs.erase(it);
      // A client that left a running job is not offered it again: it ended there, or
      // failed (the reason is its status). One that left as it paused is, once it ends.
      if (m->paused_until_ms <= UnixNowMs()) {
        declines_[left.job_id()][m->name] =
            left.status() == "OK" ? "" : "left: " + Printable(left.status().substr(0, kMaxReason));
      }
    } else if (up.has_pause()) {
      RETURN_IF_ERROR(CheckPause(up.pause(), UnixNowMs()));
      m->paused_until_ms = up.pause().until_unix_ms();
      m->pause_reason = Printable(up.pause().reason());
      spdlog::info("pool: {} pauses{}{}", m->name, m->paused_until_ms ? " until " + UnixMsText(m->paused_until_ms) : "",
                   m->pause_reason.empty() ? "" : ": " + m->pause_reason);
    } else {
      return absl::InvalidArgumentError("an attached client sends answers, departures and pauses only");
    }
  }
  changed_();
  return absl::OkStatus();
}

void PoolService::Write(Member* m, const v1::PoolDown& msg) {
  MutexLock w(&m->write_mu);
  if (m->stream != nullptr && !m->stream->Write(msg)) m->ctx->TryCancel();
}

std::vector<PoolMemberView> PoolService::Members() {
  MutexLock l(&mu_);
  std::vector<PoolMemberView> out;
  for (const auto& [name, m] : members_) out.push_back({name, m->hello, m->jobs, m->paused_until_ms, m->pause_reason});
  return out;
}

std::map<std::string, std::string> PoolService::Declines(const std::string& id) {
  MutexLock l(&mu_);
  auto it = declines_.find(id);
  return it == declines_.end() ? std::map<std::string, std::string>{} : it->second;
}

void PoolService::Offer(const std::string& name, v1::JobOffer offer) {
  std::shared_ptr<Member> m;
  {
    MutexLock l(&mu_);
    auto it = members_.find(name);
    if (it == members_.end()) return;
    m = it->second;
    m->jobs[offer.job_id()] = {false, offer.port()};
  }
  v1::PoolDown msg;
  *msg.mutable_offer() = std::move(offer);
  Write(m.get(), msg);
}

void PoolService::Release(const std::string& name, const std::string& id, const std::string& reason) {
  std::shared_ptr<Member> m;
  {
    MutexLock l(&mu_);
    auto it = members_.find(name);
    if (it == members_.end()) return;
    m = it->second;
    m->jobs.erase(id);
  }
  v1::PoolDown msg;
  msg.mutable_release()->set_job_id(id);
  msg.mutable_release()->set_reason(reason);
  Write(m.get(), msg);
}

void PoolService::Forget(const std::string& id) {
  MutexLock l(&mu_);
  declines_.erase(id);
}

void PoolService::Shutdown() {
  MutexLock l(&mu_);
  shutdown_ = true;
  for (const auto& [name, m] : members_) m->ctx->TryCancel();
}

}  // namespace cleave
