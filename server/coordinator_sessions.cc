// Coordinator: sessions (join, heartbeat, identity, revocation, expiry) and the
// messages the transport routes by session: profiles, split streams, SecAgg stages.

#include "server/coordinator.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/printable.h"
#include "server/modes/secagg_driver.h"
#include "server/modes/split_driver.h"
#include "server/rounds/scheduler.h"

namespace cleave {

std::string RandomHex(int bytes) {
  std::vector<unsigned char> buf(bytes);
  if (RAND_bytes(buf.data(), bytes) != 1) {
    spdlog::critical("OpenSSL RAND_bytes failed");
    std::abort();
  }
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : buf) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

void Coordinator::LogRefusedUpload(const v1::UploadHeader& h, const Status& why) {
  std::string name;
  {
    MutexLock l(&mu_);
    const Session* s = sessions_.Find(h.client_id());
    name = s != nullptr ? s->name : "not connected";
  }
  spdlog::warn("upload from client {} ({}) for round {} refused: {}", Printable(h.client_id()),
               name, h.round(), Printable(why.ToString(), 300));
}

Status Coordinator::CheckJoin(const v1::Join& join, const std::string& peer) const {
  if (join.protocol_version() != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("unsupported protocol version ", join.protocol_version(), " (server: 1)"));
  }
  if (join.count_from_fit() ? join.num_examples() != 0 : join.num_examples() <= 0) {
    return absl::InvalidArgumentError(
        "Join.num_examples must be > 0, or 0 with count_from_fit (each upload reporting the count)");
  }
  if (join.count_from_fit() && config().secure_aggregation.enabled) {
    return absl::FailedPreconditionError(
        "this run uses secure aggregation, which fixes each client's weight before it trains: declare the "
        "client's example count when it joins (num_examples)");
  }
  if (join.name().size() > 256) return absl::InvalidArgumentError("client name too long");
  if (join.peer_address().size() > 256 || Printable(join.peer_address(), 256) != join.peer_address() ||
      (!join.peer_address().empty() && join.peer_address().rfind(':') == std::string::npos)) {
    return absl::InvalidArgumentError("Join.peer_address must be host:port, printable, <= 256 bytes");
  }
  if (Printable(join.name(), 256) != join.name()) {  // it goes into logs and metrics
    return absl::InvalidArgumentError(absl::StrCat(
        "client name '", Printable(join.name()), "' has bytes outside printable ASCII"));
  }
  if (config().tls.mutual) {
    // The identity is the verified certificate's; a client cannot join as another.
    if (peer.empty()) return absl::UnauthenticatedError("no verified client certificate");
    if (!join.name().empty() && join.name() != peer) {
      return absl::PermissionDeniedError(absl::StrCat(
          "Join names '", Printable(join.name()), "' but the client certificate is for '",
          Printable(peer), "'"));
    }
  }
  for (const auto& [what, spec] : {std::pair{"updates", config().compression.update},
                                   std::pair{"the model broadcast", config().compression.broadcast},
                                   std::pair{"activations", config().compression.activations},
                                   std::pair{"gradients", config().compression.gradients}}) {
    const std::string family = CodecFamily(spec);
    if (family != "none" &&
        std::find(join.codecs().begin(), join.codecs().end(), family) == join.codecs().end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this run compresses ", what, " with ", spec, ", which the client does not support"));
    }
  }
  if (config().secure_aggregation.enabled &&
      std::find(join.codecs().begin(), join.codecs().end(), kSecAggCodec) == join.codecs().end()) {
    return absl::FailedPreconditionError(
        "this run uses secure aggregation, which the client does not support");
  }
  return absl::OkStatus();
}

Status Coordinator::Join(std::shared_ptr<ClientLink> link, const v1::Join& join, const std::string& peer,
                          v1::Welcome* welcome) {
  RETURN_IF_ERROR(CheckJoin(join, peer));
  std::shared_ptr<ClientLink> replaced;
  {
    MutexLock l(&mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    RETURN_IF_ERROR(sessions_.Admit(peer));
    // One session per identity: a device that reconnects replaces its old session (whose
    // open task fails), so one certificate can never stand for two clients.
    if (const std::string old = sessions_.ReplacedBy(peer); !old.empty()) {
      spdlog::info("client {} ({}) is replaced by a new connection of the same certificate", old, peer);
      replaced = EndSessionLocked(old, "replaced by a new connection");
      cv_.SignalAll();
    }
    Session joined;
    joined.token = RandomHex(16);
    joined.num_examples = join.num_examples();
    joined.count_from_fit = join.count_from_fit();
    joined.peer_address = join.peer_address();
    joined.edge = join.edge();
    joined.link = std::move(link);
    joined.last_seen = clock_->Now();
    const Session& s = sessions_.Add(std::move(joined), peer, join.name());
    welcome->set_run_id(log_.run_id());
    welcome->set_client_id(s.id);
    welcome->set_session_token(s.token);
    welcome->set_name(s.name);
    welcome->set_heartbeat_interval_ms(static_cast<int>(config().server.heartbeat_s * 1000));
    if (NeedProfile()) {
      *welcome->mutable_model() = assets_.model;
      welcome->set_profile_batch_size(config().train.batch_size);
      welcome->set_probe_digest(assets_.probe.digest);
      welcome->set_probe_size(kProbeBytes);
    }
    spdlog::info("client {} ({}) joined with {} examples", s.id, s.name, s.num_examples);
  }  // never start gRPC operations under mu_
  if (replaced) {
    replaced->Close(
        absl::AbortedError("replaced by a newer connection with the same certificate"));
  }
  return absl::OkStatus();
}

void Coordinator::Ready(const std::string& client_id) {
  MutexLock l(&mu_);
  Session* s = sessions_.Find(client_id);
  if (s == nullptr) return;
  s->ready = true;
  cv_.SignalAll();
}

void Coordinator::Heartbeat(const std::string& client_id) {
  MutexLock l(&mu_);
  if (Session* s = sessions_.Find(client_id)) s->last_seen = clock_->Now();
}

void Coordinator::Ack(const std::string& client_id, const v1::TaskAck& ack) {
  MutexLock l(&mu_);
  auto it = round_state().tasks.find(ack.task_id());
  if (it == round_state().tasks.end() || it->second.client_id != client_id) return;
  if (!ack.accepted() && it->second.state == TaskState::kAssigned) {
    const std::string why = Printable(ack.error(), 200);
    if (ack.code() == static_cast<int32_t>(absl::StatusCode::kResourceExhausted)) {
      if (Session* s = sessions_.Find(client_id)) {
        s->unfit = why;
        spdlog::warn("client {} ({}) cannot hold the model: {}; it gets no more tasks until it "
                     "joins again", client_id, s->name, why);
      }
    }
    FailTaskLocked(it->first, it->second, absl::StrCat("rejected by the client: ", why));
    cv_.SignalAll();
  }
}

void Coordinator::ControlDone(const std::string& client_id, const ClientLink* link) {
  MutexLock l(&mu_);
  const Session* s = sessions_.Find(client_id);
  if (s == nullptr || s->link.get() != link) return;
  spdlog::info("client {} disconnected", client_id);
  EndSessionLocked(client_id, "disconnected");
  cv_.SignalAll();
}

std::shared_ptr<ClientLink> Coordinator::EndSessionLocked(const std::string& id, const std::string& why) {
  Session* s = sessions_.Find(id);
  if (s == nullptr) return nullptr;
  for (auto& [task_id, t] : round_state().tasks) {
    if (t.client_id == id && t.state == TaskState::kAssigned) FailTaskLocked(task_id, t, why);
  }
  round_state().driver->ClientLeftLocked(id);
  machinery_.mode().SessionEndedLocked(id);
  machinery_.scheduler().SessionEndedLocked(id);
  std::shared_ptr<ClientLink> link = std::move(s->link);
  sessions_.Remove(id);
  return link;
}

Session* Coordinator::FindSessionLocked(const std::string& client_id) { return sessions_.Find(client_id); }

void Coordinator::FailTaskLocked(const std::string& task_id, TaskRecord& t,
                                  const std::string& why) {
  spdlog::warn("task {} of client {} failed: {}", task_id, t.client_id, why);
  t.state = TaskState::kFailed;
  t.resolved_in = round_state().number;
  t.failure = why;
  if (Session* s = sessions_.Find(t.client_id)) ++s->failures;
  round_state().driver->TaskFailedLocked(t);
}

Status Coordinator::Authenticate(const std::string& client_id, const std::string& token,
                                  const std::string& peer) {
  MutexLock l(&mu_);
  return SessionLocked(client_id, token, peer).status();
}

StatusOr<const Session*> Coordinator::SessionLocked(const std::string& client_id,
                                                     const std::string& token,
                                                     const std::string& peer) const {
  return sessions_.Authenticate(client_id, token, peer);
}

Status Coordinator::SecAggSubmit(const v1::SecAggRequest& req, const std::string& peer) {
  MutexLock l(&mu_);
  RETURN_IF_ERROR(CheckSenderLocked("secure-aggregation message", req.client_id(),
                                    req.session_token(), peer, req.run_id(), req.round())
                      .status());
  SecAggDriver* secagg = machinery_.secagg();
  if (!secagg) return absl::FailedPreconditionError("this run has no secure aggregation");
  secagg->mu().AssertHeld();  // this->mu_
  return secagg->SubmitLocked(req);
}

Status Coordinator::SetProfile(const std::string& client_id, const v1::Profile& p) {
  if (!NeedProfile()) return absl::OkStatus();  // nothing to decide from it
  RETURN_IF_ERROR(machinery_.mode().CheckProfile(p));
  MutexLock l(&mu_);
  if (sessions_.Find(client_id) == nullptr) return absl::OkStatus();
  machinery_.mode().ProfileLocked(client_id, p);
  return absl::OkStatus();
}

StatusOr<SplitStreamTask> Coordinator::OpenSplit(const v1::SplitOpen& open,
                                                  const std::string& peer) {
  MutexLock l(&mu_);
  RETURN_IF_ERROR(CheckSenderLocked("split stream", open.client_id(), open.session_token(), peer,
                                    open.run_id(), open.round())
                      .status());
  SplitStreams* split = machinery_.split();
  if (!split) return absl::FailedPreconditionError("this run is not split learning");
  split->mu().AssertHeld();  // this->mu_
  return split->OpenLocked(open);
}

void Coordinator::SplitEnded(const SplitStreamTask& task, const Status& why) {
  MutexLock l(&mu_);
  SplitStreams* split = machinery_.split();
  if (!split) return;
  split->mu().AssertHeld();  // this->mu_
  split->EndedLocked(task, why);
}

StatusOr<const Session*> Coordinator::CheckSenderLocked(const std::string& what,
                                                         const std::string& client_id,
                                                         const std::string& token,
                                                         const std::string& peer,
                                                         const std::string& run_id,
                                                         int64_t round) const {
  ASSIGN_OR_RETURN(const Session* s, SessionLocked(client_id, token, peer));
  if (run_id != log_.run_id()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " for run ", Printable(run_id), ", this is run ", log_.run_id()));
  }
  RETURN_IF_ERROR(machinery_.scheduler().CheckRoundLocked(what, round));
  return s;
}

void Coordinator::Revoke(std::set<std::string> revoked) {
  std::vector<std::shared_ptr<ClientLink>> cut;
  {
    MutexLock l(&mu_);
    for (const std::string& id : sessions_.Revoke(std::move(revoked))) {
      spdlog::warn("client {} ({}): certificate revoked; ending its session", id, sessions_.Find(id)->identity);
      cut.push_back(EndSessionLocked(id, "certificate revoked"));
    }
    cv_.SignalAll();
  }
  for (auto& r : cut) {  // never start gRPC operations under mu_
    r->Close(absl::PermissionDeniedError("certificate revoked"));
  }
}


int Coordinator::ConnectedLocked() const {
  return sessions_.Ready();
}

std::vector<std::string> Coordinator::AvailableLocked() const {
  // The mode's driver runs under mu_, which this holds.
  return sessions_.Available([this](const std::string& id) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return machinery_.mode().ServesLocked(id);
  });
}

void Coordinator::ExpireSilentLocked() {
  const auto limit = Seconds(config().server.client_timeout_s);
  const auto now = clock_->Now();
  const std::vector<std::shared_ptr<UploadCall>> stalled =
      uploads_.ExpireIdle(Seconds(config().server.upload_idle_timeout_s), now);
  for (auto& r : stalled) {
    const v1::UploadHeader* h = r->header();
    spdlog::warn("upload from client {} made no progress for {:.0f}s: cancelling it",
                 h ? Printable(h->client_id()) : "(no header yet)",
                 config().server.upload_idle_timeout_s);
    if (h == nullptr) continue;
    auto t = round_state().tasks.find(h->task_id());
    if (t != round_state().tasks.end() && t->second.client_id == h->client_id() &&
        t->second.state == TaskState::kAssigned) {
      FailTaskLocked(t->first, t->second, "its upload stalled");
      cv_.SignalAll();
    }
  }
  std::vector<std::shared_ptr<ClientLink>> silent;
  for (const std::string& id : sessions_.Ids()) {
    if (now - sessions_.Find(id)->last_seen > limit) {
      spdlog::warn("client {} silent for {:.0f}s: dropping it", id, config().server.client_timeout_s);
      silent.push_back(EndSessionLocked(id, "heartbeat timeout"));
    }
  }
  if (silent.empty() && stalled.empty()) return;
  mu_.Unlock();
  for (auto& r : silent) r->Close(absl::UnavailableError("heartbeat timeout"));
  for (auto& r : stalled) r->Cancel();
  mu_.Lock();
}

void Coordinator::CountSplitUp(int64_t bytes) {
  CountUp(bytes);
  if (SplitStreams* split = machinery_.split()) split->CountUp(bytes);
}

void Coordinator::CountSplitDown(int64_t bytes) {
  CountDown(bytes);
  if (SplitStreams* split = machinery_.split()) split->CountDown(bytes);
}

void Coordinator::CountLabels(int64_t labels) {
  if (SplitStreams* split = machinery_.split()) split->CountLabels(labels);
}


int Coordinator::SetMaxSessions(int derived) {
  MutexLock l(&mu_);
  sessions_.set_max(config().server.max_sessions > 0 ? config().server.max_sessions : derived);
  return sessions_.max();
}

}  // namespace cleave
