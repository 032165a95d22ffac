#include "server/coordinator.h"

#include <malloc.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aggregation/staleness.h"
#include "core/files.h"
#include "core/printable.h"
#include "models/part.h"
#include "models/safetensors.h"
#include "proto/split_chunks.h"

namespace cleave {

// Constant-time comparison, so response timing does not leak a token byte by byte.
bool TokenMatches(const std::string& expected, const std::string& given) {
  return expected.size() == given.size() &&
         CRYPTO_memcmp(expected.data(), given.data(), expected.size()) == 0;
}

namespace {

// Hex of `bytes` bytes from OpenSSL's CSPRNG: session tokens must not be guessable.
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


int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}


std::string MetricsJson(const RoundMetrics& m) {
  nlohmann::json j = {{"round", m.round},
                      {"train_loss", m.train_loss},
                      {"participants", m.participants},
                      {"failures", m.failures},
                      {"bytes_up", m.bytes_up},
                      {"bytes_down", m.bytes_down},
                      {"bytes_up_fp32", m.bytes_up_fp32},
                      {"update_bytes", m.update_bytes},
                      {"bytes_down_fp32", m.bytes_down_fp32},
                      {"compression_up", m.bytes_up ? double(m.bytes_up_fp32) / m.bytes_up : 1.0},
                      {"compression_down",
                       m.bytes_down ? double(m.bytes_down_fp32) / m.bytes_down : 1.0},
                      {"wall_s", m.wall_s},
                      {"elapsed_s", m.elapsed_s}};
  if (m.evaluation_only) {
    j.erase("train_loss");
    j["evaluation_only"] = true;
  }
  if (m.evaluated) {
    j["test_accuracy"] = m.test_accuracy;
    j["test_loss"] = m.test_loss;
    for (const auto& [k, v] : m.test_metrics) j["test_" + k] = v;
    if (!m.test_per_class_accuracy.empty()) {
      auto& per_class = j["test_per_class_accuracy"] = nlohmann::json::array();
      for (double a : m.test_per_class_accuracy) {
        per_class.push_back(std::isnan(a) ? nlohmann::json(nullptr) : nlohmann::json(a));
      }
    }
  }
  if (m.split) {
    j["activation_bytes_up"] = m.activation_bytes_up;
    j["gradient_bytes_down"] = m.gradient_bytes_down;
    j["labels_up"] = m.labels_up;
    j["cuts"] = m.cuts;
    j["step_s"] = m.step_s;
    j["client_compute_s"] = m.client_compute_s;
    j["transfer_s"] = m.transfer_s;
    j["server_compute_s"] = m.server_compute_s;
    j["server_busy"] = m.server_busy;
  }
  if (m.client_eval.clients > 0) {
    const auto& e = m.client_eval;
    j["client_eval"] = {{"clients", e.clients},           {"examples", e.examples},
                        {"accuracy", e.accuracy},         {"loss", e.loss},
                        {"accuracy_min", e.accuracy_min}, {"accuracy_median", e.accuracy_median},
                        {"accuracy_max", e.accuracy_max}, {"loss_min", e.loss_min},
                        {"loss_median", e.loss_median}, {"loss_max", e.loss_max},
                        {"seconds", e.seconds},
                        {"train_seconds", e.train_seconds}};
    for (const auto& [k, v] : e.metrics) j["client_eval"][k] = v;
    if (m.evaluation_only) j["client_eval"].erase("train_seconds");  // nothing trained
  }
  if (m.async) {
    j["version"] = m.round;
    auto& st = j["staleness"] = nlohmann::json::object();
    double sum = 0;
    int64_t most = 0;
    for (const auto& [s, n] : m.staleness) {
      st[std::to_string(s)] = n;
      sum += static_cast<double>(s) * n;
      most = std::max(most, s);
    }
    j["staleness_mean"] = m.participants ? sum / m.participants : 0.0;
    j["staleness_max"] = most;
    j["local_steps"] = {{"mean", m.local_steps_mean}, {"min", m.local_steps_min},
                        {"max", m.local_steps_max}};
  }
  for (const auto& [k, v] : m.strategy_stats) j[k] = v;
  return j.dump();
}

// The round's federated evaluation from the tasks that reported one.
RoundMetrics::ClientEvaluations SummariseEvaluations(const std::vector<const TaskRecord*>& tasks) {
  RoundMetrics::ClientEvaluations e;
  if (tasks.empty()) return e;
  std::vector<double> accuracies, losses;
  std::map<std::string, int64_t> metric_examples;  // a client may omit a metric
  for (const TaskRecord* t : tasks) {
    const auto& r = t->evaluation;
    ++e.clients;
    e.examples += r.examples();
    e.accuracy += r.accuracy() * r.examples();
    e.loss += r.loss() * r.examples();
    e.seconds += r.seconds();
    e.train_seconds += t->train_seconds;
    accuracies.push_back(r.accuracy());
    losses.push_back(r.loss());
    for (const auto& [k, v] : r.metrics()) {
      e.metrics[k] += v * r.examples();
      metric_examples[k] += r.examples();
    }
  }
  e.accuracy /= e.examples;
  e.loss /= e.examples;
  for (auto& [k, v] : e.metrics) v /= metric_examples[k];
  e.seconds /= e.clients;
  e.train_seconds /= e.clients;
  auto spread = [](std::vector<double> v, double* min, double* median, double* max) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    *min = v.front();
    *max = v.back();
    *median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  };
  spread(accuracies, &e.accuracy_min, &e.accuracy_median, &e.accuracy_max);
  spread(losses, &e.loss_min, &e.loss_median, &e.loss_max);
  return e;
}

// The round's local training settings as the server trains with them: FLTrust's
// reference update and the server's parts of a cut model (clients get the same through
// their task's TrainConfig).
// Whether task `t` still takes an upload: OK, or OK with *duplicate when one was already
// counted; refused when the task failed or another upload of it is being added.
Status TaskTakesUpload(const std::string& task_id, const TaskRecord& t, bool* duplicate) {
  switch (t.state) {
    case TaskState::kAssigned:
      return absl::OkStatus();
    case TaskState::kDone:
      *duplicate = true;
      return absl::OkStatus();
    case TaskState::kFailed:
      return absl::FailedPreconditionError(
          absl::StrCat("task ", Printable(task_id), " was already counted as failed",
                       t.failure.empty() ? "" : " (" + t.failure + ")"));
    case TaskState::kAccumulating:
      return absl::AbortedError(
          absl::StrCat("an upload of task ", Printable(task_id), " is being added; retry"));
  }
  return absl::InternalError("unknown task state");
}

LocalTrainOptions ServerTraining(const FitSettings& fit, uint64_t seed) {
  LocalTrainOptions o;
  o.epochs = fit.local_epochs;
  o.local_steps = fit.local_steps;
  o.batch_size = fit.batch_size;
  o.optimizer = fit.optimizer;
  o.loss = fit.loss;
  o.lr = fit.lr;
  o.momentum = fit.momentum;
  o.nesterov = fit.nesterov;
  o.weight_decay = fit.weight_decay;
  o.clip_norm = fit.clip_norm;
  o.label_smoothing = fit.label_smoothing;
  o.seed = seed;
  return o;
}

}  // namespace

void Coordinator::RegisterUpload(std::shared_ptr<UploadCall> r) {
  MutexLock l(&upload_mu_);
  open_uploads_[r.get()] = std::move(r);
}

void Coordinator::UnregisterUpload(UploadCall* r) {
  MutexLock l(&upload_mu_);
  open_uploads_.erase(r);
  if (const v1::UploadHeader* h = r->header()) {
    auto it = upload_of_client_.find(h->client_id());
    if (it != upload_of_client_.end() && it->second == r) upload_of_client_.erase(it);
  }
}

bool Coordinator::ClaimUpload(const std::string& client_id, UploadCall* r) {
  std::shared_ptr<UploadCall> older;
  bool has_slot = false;
  {
    MutexLock l(&upload_mu_);
    UploadCall*& current = upload_of_client_[client_id];
    if (current != nullptr && current != r) {
      auto it = open_uploads_.find(current);
      if (it != open_uploads_.end()) older = it->second;
    }
    current = r;
    if (upload_slots_free_ > 0) {
      --upload_slots_free_;
      r->has_slot = has_slot = true;
      r->Granted();
    } else {
      r->Queue();
      upload_waiters_.push_back(r);
    }
  }
  if (older) {  // outside upload_mu_: cancelling may run OnCancel inline
    spdlog::warn("client {} opened a second upload; cancelling its older one",
                 Printable(client_id));
    older->Cancel();
  }
  return has_slot;
}

void Coordinator::LogRefusedUpload(const v1::UploadHeader& h, const Status& why) {
  std::string name;
  {
    MutexLock l(&mu_);
    auto it = sessions_.find(h.client_id());
    name = it != sessions_.end() ? it->second.name : "not connected";
  }
  spdlog::warn("upload from client {} ({}) for round {} refused: {}", Printable(h.client_id()),
               name, h.round(), Printable(why.ToString(), 300));
}

void Coordinator::CancelOpenUploads() {
  std::vector<std::shared_ptr<UploadCall>> open;
  {
    MutexLock l(&upload_mu_);
    for (auto& [p, r] : open_uploads_) open.push_back(r);
  }
  // Outside upload_mu_: cancellation may run OnCancel inline, which takes it.
  for (auto& r : open) r->Cancel();
}

bool Coordinator::CancelWaitingUpload(UploadCall* r) {
  MutexLock l(&upload_mu_);
  auto it = std::find(upload_waiters_.begin(), upload_waiters_.end(), r);
  if (it == upload_waiters_.end()) return false;
  upload_waiters_.erase(it);
  return true;
}

void Coordinator::ReleaseUploadSlot() {
  UploadCall* next = nullptr;
  {
    MutexLock l(&upload_mu_);
    if (upload_waiters_.empty()) {
      ++upload_slots_free_;
      return;
    }
    next = upload_waiters_.front();  // the slot passes straight to the next upload
    upload_waiters_.pop_front();
    next->has_slot = true;
    next->Granted();
  }
  next->Resume();
}

Status Coordinator::Join(std::shared_ptr<ClientLink> link, const v1::Join& join, const std::string& peer,
                          v1::Welcome* welcome) {
  if (join.protocol_version() != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("unsupported protocol version ", join.protocol_version(), " (server: 1)"));
  }
  if (join.num_examples() <= 0) {
    return absl::InvalidArgumentError("Join.num_examples must be > 0");
  }
  if (join.name().size() > 256) return absl::InvalidArgumentError("client name too long");
  if (Printable(join.name(), 256) != join.name()) {  // it goes into logs and metrics
    return absl::InvalidArgumentError(absl::StrCat(
        "client name '", Printable(join.name()), "' has bytes outside printable ASCII"));
  }
  if (cfg_.tls.mutual) {
    // The identity is the verified certificate's; a client cannot join as another.
    if (peer.empty()) return absl::UnauthenticatedError("no verified client certificate");
    if (!join.name().empty() && join.name() != peer) {
      return absl::PermissionDeniedError(absl::StrCat(
          "Join names '", Printable(join.name()), "' but the client certificate is for '",
          Printable(peer), "'"));
    }
  }
  for (const auto& [what, spec] : {std::pair{"updates", cfg_.compression.update},
                                   std::pair{"the model broadcast", cfg_.compression.broadcast},
                                   std::pair{"activations", cfg_.compression.activations},
                                   std::pair{"gradients", cfg_.compression.gradients}}) {
    const std::string family = CodecFamily(spec);
    if (family != "none" &&
        std::find(join.codecs().begin(), join.codecs().end(), family) == join.codecs().end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this run compresses ", what, " with ", spec, ", which the client does not support"));
    }
  }
  if (cfg_.secure_aggregation.enabled &&
      std::find(join.codecs().begin(), join.codecs().end(), kSecAggCodec) == join.codecs().end()) {
    return absl::FailedPreconditionError(
        "this run uses secure aggregation, which the client does not support");
  }
  std::shared_ptr<ClientLink> replaced;
  {
    MutexLock l(&mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    if (static_cast<int>(sessions_.size()) >= max_sessions_) {
      // A device reconnecting with its certificate replaces its session (below): it may.
      const bool replaces = cfg_.tls.mutual && std::any_of(sessions_.begin(), sessions_.end(),
                                                           [&](const auto& kv) {
                                                             return kv.second.identity == peer;
                                                           });
      if (!replaces) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the server holds its maximum of ", max_sessions_, " sessions (server.max_sessions)"));
      }
    }
    if (cfg_.tls.mutual && revoked_.count(peer)) {
      spdlog::warn("refused a Join from revoked certificate '{}'", Printable(peer));
      return absl::PermissionDeniedError(absl::StrCat("the certificate of '", Printable(peer),
                                                      "' is revoked"));
    }
    // One session per identity: a device that reconnects replaces its old session (whose
    // open task fails), so one certificate can never stand for two clients.
    if (cfg_.tls.mutual) {
      for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
        if (it->second.identity != peer) continue;
        spdlog::info("client {} ({}) is replaced by a new connection of the same certificate",
                     it->first, peer);
        FailTasksOfLocked(it->first, "replaced by a new connection");
        if (secagg_) secagg_->Drop(it->first);
        replaced = std::move(it->second.link);
        sessions_.erase(it);
        cv_.SignalAll();
        break;
      }
    }
    Session s;
    s.id = absl::StrCat("c", next_client_++);
    s.identity = cfg_.tls.mutual ? peer : "";
    s.name = !s.identity.empty() ? s.identity : join.name().empty() ? s.id : join.name();
    s.token = RandomHex(16);
    s.num_examples = join.num_examples();
    s.link = std::move(link);
    s.last_seen = clock_->Now();
    welcome->set_run_id(run_id_);
    welcome->set_client_id(s.id);
    welcome->set_session_token(s.token);
    welcome->set_heartbeat_interval_ms(static_cast<int>(cfg_.server.heartbeat_s * 1000));
    if (NeedProfile()) {
      *welcome->mutable_model() = model_desc_;
      welcome->set_profile_batch_size(cfg_.train.batch_size);
      welcome->set_probe_digest(probe_digest_);
      welcome->set_probe_size(kProbeBytes);
    }
    spdlog::info("client {} ({}) joined with {} examples", s.id, s.name, s.num_examples);
    sessions_[s.id] = std::move(s);
  }  // never start gRPC operations under mu_
  if (replaced) {
    replaced->Close(
        absl::AbortedError("replaced by a newer connection with the same certificate"));
  }
  return absl::OkStatus();
}

void Coordinator::Ready(const std::string& client_id) {
  MutexLock l(&mu_);
  auto it = sessions_.find(client_id);
  if (it == sessions_.end()) return;
  it->second.ready = true;
  cv_.SignalAll();
}

void Coordinator::Heartbeat(const std::string& client_id) {
  MutexLock l(&mu_);
  auto it = sessions_.find(client_id);
  if (it != sessions_.end()) it->second.last_seen = clock_->Now();
}

void Coordinator::Ack(const std::string& client_id, const v1::TaskAck& ack) {
  MutexLock l(&mu_);
  auto it = tasks_.find(ack.task_id());
  if (it == tasks_.end() || it->second.client_id != client_id) return;
  if (!ack.accepted() && it->second.state == TaskState::kAssigned) {
    FailTaskLocked(it->first, it->second,
                   absl::StrCat("rejected by the client: ", Printable(ack.error(), 200)));
    cv_.SignalAll();
  }
}

void Coordinator::ControlDone(const std::string& client_id, const ClientLink* link) {
  MutexLock l(&mu_);
  auto it = sessions_.find(client_id);
  if (it == sessions_.end() || it->second.link.get() != link) return;
  spdlog::info("client {} disconnected", it->first);
  FailTasksOfLocked(it->first, "disconnected");
  if (secagg_) secagg_->Drop(it->first);
  sessions_.erase(it);
  cv_.SignalAll();
}

void Coordinator::FailTasksOfLocked(const std::string& client_id, const std::string& why) {
  for (auto& [id, t] : tasks_) {
    if (t.client_id == client_id && t.state == TaskState::kAssigned) FailTaskLocked(id, t, why);
  }
}

void Coordinator::FailTaskLocked(const std::string& task_id, TaskRecord& t,
                                  const std::string& why) {
  spdlog::warn("task {} of client {} failed: {}", task_id, t.client_id, why);
  t.state = TaskState::kFailed;
  t.resolved_in = current_round_;
  t.failure = why;
  if (t.split && split_round_) split_round_->Fail(t.client_id);
  if (secagg_) secagg_->Drop(t.client_id);
}

Status Coordinator::Authenticate(const std::string& client_id, const std::string& token,
                                  const std::string& peer) {
  MutexLock l(&mu_);
  return SessionLocked(client_id, token, peer).status();
}

StatusOr<const Session*> Coordinator::SessionLocked(const std::string& client_id,
                                                     const std::string& token,
                                                     const std::string& peer) const {
  auto s = sessions_.find(client_id);
  if (s == sessions_.end() || !TokenMatches(s->second.token, token)) {
    return absl::UnauthenticatedError("unknown client or wrong session token");
  }
  if (!peer.empty() && revoked_.count(peer)) {
    return absl::PermissionDeniedError("certificate revoked");
  }
  if (s->second.identity != peer) {
    return absl::PermissionDeniedError(absl::StrCat(
        "client ", client_id, " joined as '", s->second.identity,
        "'; this call's certificate is '", peer, "'"));
  }
  return &s->second;
}

Status Coordinator::SecAggSubmit(const v1::SecAggRequest& req, const std::string& peer) {
  MutexLock l(&mu_);
  RETURN_IF_ERROR(CheckSenderLocked("secure-aggregation message", req.client_id(),
                                    req.session_token(), peer, req.run_id(), req.round())
                      .status());
  if (!secagg_) return absl::FailedPreconditionError("this round has no secure aggregation");
  auto t = tasks_.find(req.task_id());
  if (t == tasks_.end() || t->second.client_id != req.client_id()) {
    return absl::FailedPreconditionError(absl::StrCat("task ", Printable(req.task_id()),
                                                      " was not given to client ",
                                                      Printable(req.client_id()), " this round"));
  }
  if (t->second.state == TaskState::kFailed) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", Printable(req.task_id()), " has failed"));
  }
  Status s;
  switch (req.stage_case()) {
    case v1::SecAggRequest::kKeys: s = secagg_->AddKeys(req.client_id(), req.keys()); break;
    case v1::SecAggRequest::kShares: s = secagg_->AddShares(req.client_id(), req.shares()); break;
    case v1::SecAggRequest::kReveal: s = secagg_->AddReveal(req.client_id(), req.reveal()); break;
    default: return absl::InvalidArgumentError("a secure-aggregation message without a stage");
  }
  if (s.ok()) {
    cv_.SignalAll();
  } else {
    spdlog::warn("round {}: secure-aggregation message from {} refused: {}", current_round_,
                 req.client_id(), s.ToString());
  }
  return s;
}

Status Coordinator::SetProfile(const std::string& client_id, const v1::Profile& p) {
  if (!NeedProfile()) return absl::OkStatus();  // nothing to decide from it
  if (p.stage_seconds_size() != num_stages_) {
    return absl::InvalidArgumentError(absl::StrCat("profile has ", p.stage_seconds_size(),
                                                   " stage times, the model ", num_stages_));
  }
  for (double t : p.stage_seconds()) {
    if (!std::isfinite(t) || t < 0) {
      return absl::InvalidArgumentError("profile stage times must be finite and >= 0");
    }
  }
  for (double v : {p.uplink_bytes_per_s(), p.downlink_bytes_per_s(), p.rtt_s()}) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError("profile link measurements must be finite and >= 0");
    }
  }
  if (p.memory_limit_bytes() < 0) return absl::InvalidArgumentError("negative memory limit");
  MutexLock l(&mu_);
  auto it = sessions_.find(client_id);
  if (it == sessions_.end()) return absl::OkStatus();
  it->second.profile = p;
  it->second.has_profile = true;
  spdlog::info("client {} profiled: {:.1f} ms per batch for the whole model, up {:.2f} MB/s, "
               "down {:.2f} MB/s, memory limit {} MB",
               it->first,
               1e3 * std::accumulate(p.stage_seconds().begin(), p.stage_seconds().end(), 0.0),
               p.uplink_bytes_per_s() / 1e6, p.downlink_bytes_per_s() / 1e6,
               p.memory_limit_bytes() >> 20);
  cv_.SignalAll();
  return absl::OkStatus();
}

StatusOr<SplitStreamTask> Coordinator::OpenSplit(const v1::SplitOpen& open,
                                                  const std::string& peer) {
  MutexLock l(&mu_);
  RETURN_IF_ERROR(CheckSenderLocked("split stream", open.client_id(), open.session_token(), peer,
                                    open.run_id(), open.round())
                      .status());
  auto t = tasks_.find(open.task_id());
  if (t == tasks_.end() || t->second.client_id != open.client_id() || !t->second.split) {
    return absl::FailedPreconditionError(absl::StrCat("no split task ", Printable(open.task_id()),
                                                      " for client ", Printable(open.client_id())));
  }
  if (t->second.state != TaskState::kAssigned) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", Printable(open.task_id()), " is over"));
  }
  if (t->second.split_open) {
    return absl::AlreadyExistsError(
        absl::StrCat("task ", Printable(open.task_id()), " already has a split stream"));
  }
  t->second.split_open = true;
  SplitStreamTask task;
  task.client_id = open.client_id();
  task.task_id = open.task_id();
  task.round = split_round_;
  task.window = cfg_.split.window;
  task.act_codec = SplitCodec(cfg_.compression.activations);
  task.grad_codec = SplitCodec(cfg_.compression.gradients);
  task.max_elements = cfg_.server.max_model_elements;
  return task;
}

void Coordinator::SplitEnded(const SplitStreamTask& task, const Status& why) {
  MutexLock l(&mu_);
  auto t = tasks_.find(task.task_id);
  if (t == tasks_.end() || t->second.client_id != task.client_id || task.round != split_round_ ||
      t->second.state != TaskState::kAssigned) {
    return;
  }
  FailTaskLocked(t->first, t->second, absl::StrCat("split stream: ", why.ToString()));
  cv_.SignalAll();
}

StatusOr<const Session*> Coordinator::CheckSenderLocked(const std::string& what,
                                                         const std::string& client_id,
                                                         const std::string& token,
                                                         const std::string& peer,
                                                         const std::string& run_id,
                                                         int64_t round) const {
  ASSIGN_OR_RETURN(const Session* s, SessionLocked(client_id, token, peer));
  if (run_id != run_id_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " for run ", Printable(run_id), ", this is run ", run_id_));
  }
  if (async() && current_round_ != 0) {
    // Tasks outlive the version they were given in, up to scheduler.max_staleness.
    if (round > current_round_) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " for model version ", round - 1, ", a future one: the newest is ",
          current_round_ - 1));
    }
    if (current_round_ - round > cfg_.scheduler.max_staleness) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " against model version ", round - 1, ", ", current_round_ - round,
          " versions stale: scheduler.max_staleness is ", cfg_.scheduler.max_staleness));
    }
    return s;
  }
  if (current_round_ == 0 || round != current_round_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " for round ", round, ", the current round is ", current_round_));
  }
  return s;
}

StatusOr<int64_t> Coordinator::CheckUploadHeader(const v1::UploadHeader& h,
                                                  const std::string& peer, bool* duplicate) {
  MutexLock l(&mu_);
  ASSIGN_OR_RETURN(const Session* s, CheckSenderLocked("upload", h.client_id(), h.session_token(),
                                                       peer, h.run_id(), h.round()));
  auto t = tasks_.find(h.task_id());
  if (t == tasks_.end() || t->second.client_id != h.client_id()) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", Printable(h.task_id()), " was not given to client ",
                     Printable(h.client_id()), " in round ", current_round_));
  }
  if (h.round() != t->second.round) {
    return absl::FailedPreconditionError(absl::StrCat(
        "task ", Printable(h.task_id()), " was given in round ", t->second.round, ", not ",
        h.round()));
  }
  RETURN_IF_ERROR(TaskTakesUpload(h.task_id(), t->second, duplicate));
  if (*duplicate) return int64_t{0};
  if (h.codec() != t->second.codec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "update codec '", Printable(h.codec()), "', the task asked for '", t->second.codec, "'"));
  }
  if (h.num_examples() <= 0 || h.num_examples() > s->num_examples) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_examples ", h.num_examples(), " is not in [1, ", s->num_examples,
                     "] (the client's declared data size)"));
  }
  if (!std::isfinite(h.train_loss())) {
    return absl::InvalidArgumentError("train_loss is not finite");
  }
  if (h.has_evaluation()) {
    // Held-out data is at most 90 % of a client's data (--holdout <= 0.9): 9x its
    // declared training examples.
    const auto& e = h.evaluation();
    if (e.examples() < 1 || e.examples() > 9 * s->num_examples || !(e.accuracy() >= 0) ||
        !(e.accuracy() <= 1) || !std::isfinite(e.loss()) || e.loss() < 0 ||
        !std::isfinite(e.seconds()) || e.seconds() < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "evaluation: examples must be in [1, ", 9 * s->num_examples,
          "], accuracy in [0, 1], loss and seconds finite and >= 0"));
    }
    for (const auto& [k, v] : e.metrics()) {
      const bool fraction = k == "top5_accuracy" || k == "precision" || k == "recall" || k == "f1";
      // Text: perplexity is exp(loss) >= 1; bits per byte and tokens counted are >= 0.
      const bool text = k == "perplexity" || k == "bits_per_byte" || k == "tokens";
      if (!(fraction || text || k == "mae" || k == "rmse") || !std::isfinite(v) || v < 0 ||
          (fraction && v > 1) || (k == "perplexity" && v < 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "evaluation: metric '", Printable(k), "' unknown or out of range"));
      }
    }
  }
  const int64_t expected = t->second.expected_size;
  if (h.total_size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "upload announces ", h.total_size(), " bytes; an update of this model has ", expected));
  }
  if (t->second.split) {
    const auto& st = h.split();
    for (double v : {st.client_compute_s(), st.transfer_s(), st.server_compute_s(), st.wall_s()}) {
      if (!std::isfinite(v) || v < 0) {
        return absl::InvalidArgumentError("split stats must be finite and >= 0");
      }
    }
  }
  return expected;
}

std::string Coordinator::TakeBuffer(int64_t size) {
  std::string b;
  {
    MutexLock l(&buffers_mu_);
    if (!buffers_.empty()) {
      b = std::move(buffers_.back());
      buffers_.pop_back();
    }
  }
  b.clear();
  b.reserve(size);
  return b;
}

void Coordinator::ReturnBuffer(std::string buffer) {
  MutexLock l(&buffers_mu_);
  if (static_cast<int>(buffers_.size()) < cfg_.server.worker_threads) buffers_.push_back(std::move(buffer));
}

void Coordinator::DropBuffers() {
  std::vector<std::string> drop;
  MutexLock l(&buffers_mu_);
  drop.swap(buffers_);
}

Status Coordinator::ProcessUpload(const v1::UploadHeader& h, const std::string& payload,
                                  bool* duplicate) {
  // Structure checks need no lock; the payload is ours.
  std::vector<TensorView> views;
  if (h.codec() == "fp32") {
    ASSIGN_OR_RETURN(views, ParseParameterSet(payload, cfg_.server.max_model_elements));
  }
  static const ParameterSet kNothing;  // an evaluation task's upload
  // What the work outside the lock reads. The round stays open while a task is
  // kAccumulating (RunRound waits for accumulating_ to reach 0 before it closes), so the
  // layout (global_ or shared_layout_) and the strategy's round do not change meanwhile.
  const ParameterSet* layout = nullptr;
  int64_t weight = 0;
  bool split = false;
  std::shared_ptr<const ParameterSet> part;
  std::shared_ptr<SplitRound> split_round;
  float staleness_factor = 1.0f;
  {
    MutexLock l(&mu_);
    if (async()) {
      // A buffer being applied, or full with uploads still being added: this one goes
      // into the next (a short wait: CPU work, not a client).
      while (!stopping_ && current_round_ != 0 &&
             (applying_ || claimed_ >= cfg_.scheduler.buffer_size)) {
        cv_.Wait(&mu_);
      }
    }
    // Re-check under the lock: the round may have closed while we were reading.
    auto t = tasks_.find(h.task_id());
    const bool open = async() ? current_round_ != 0 && h.round() <= current_round_
                              : h.round() == current_round_;
    if (!open || t == tasks_.end() || t->second.client_id != h.client_id()) {
      return absl::FailedPreconditionError(
          absl::StrCat("round ", h.round(), " closed before the upload completed"));
    }
    RETURN_IF_ERROR(TaskTakesUpload(h.task_id(), t->second, duplicate));
    if (*duplicate) return absl::OkStatus();
    if (async()) {
      const int64_t staleness = current_round_ - t->second.round;
      if (staleness > cfg_.scheduler.max_staleness) {
        ObserveSpeedLocked(t->second, h);  // so that its next task is sized to arrive in time
        FailTaskLocked(h.task_id(), t->second, "too stale");
        cv_.SignalAll();
        return absl::FailedPreconditionError(absl::StrCat(
            "update against model version ", t->second.round - 1, " is ", staleness,
            " versions stale: scheduler.max_staleness is ", cfg_.scheduler.max_staleness));
      }
      t->second.staleness = staleness;
      staleness_factor = static_cast<float>(StalenessFactor(cfg_.scheduler, staleness));
      ++claimed_;
    }
    split = t->second.split;
    layout = split                      ? t->second.part.get()
             : t->second.evaluate_only ? &kNothing
                                       : &UpdateLayout();
    if (t->second.evaluate_only && h.evaluation().examples() == 0) {
      return absl::InvalidArgumentError("an evaluation task's upload must carry its evaluation");
    }
    weight = round_weights_.Weight(h.num_examples());
    if (h.codec() == kSecAggCodec) {
      // A masked input: checked and added into the round's sum mod M. The strategy gets
      // the round's unmasked sum when the last stage closes.
      RETURN_IF_ERROR(secagg_ ? secagg_->AddMasked(h.client_id(), payload)
                              : absl::FailedPreconditionError("no secure aggregation this round"));
      AcceptLocked(t->second, h, weight, payload.size(), *layout);
      return absl::OkStatus();
    }
    if (t->second.evaluate_only) {  // nothing to add
      AcceptLocked(t->second, h, weight, payload.size(), *layout);
      return absl::OkStatus();
    }
    part = t->second.part;
    split_round = split_round_;
    t->second.state = TaskState::kAccumulating;
    ++accumulating_;
  }
  // Model-sized work without the coordinator's lock: uploads are checked in parallel on
  // the workers, and only the strategy's sum is taken one at a time (accumulate_mu_).
  if (opts_.before_accumulate) opts_.before_accumulate();
  Status s = [&]() -> Status {
    if (h.codec() != "fp32") {
      // Checked here, then read block by block through the codec like an fp32 update:
      // no decoded copy is made.
      ASSIGN_OR_RETURN(views, ViewEncodedTensors(*update_codec_, payload, *layout));
    }
    // Bounded values: with bounded weights no sum of updates can overflow, so no upload
    // can make the model non-finite.
    RETURN_IF_ERROR(CheckViews(*layout, views, static_cast<float>(cfg_.server.max_update_abs)));
    for (auto& v : views) v.scale = staleness_factor;
    if (!split) {
      MutexLock a(&accumulate_mu_);
      strategy_->Accumulate(views, weight);
      return absl::OkStatus();
    }
    // The client's trained part: the part it was given plus its delta (with LoRA, the
    // adapters; the frozen tensors are as the round started).
    ParameterSet trained = *part;
    for (size_t i = 0; i < views.size(); ++i) {
      auto& v = trained.mutable_tensors()[i].values;
      std::vector<float> delta(v.size());
      views[i].Read(0, views[i].numel, delta.data());
      for (size_t j = 0; j < v.size(); ++j) v[j] += delta[j];
    }
    if (!frozen_.empty()) {
      ASSIGN_OR_RETURN(ParameterSet whole, split_round->ClientPart(h.client_id()));
      RETURN_IF_ERROR(Overwrite(trained, &whole));
      trained = std::move(whole);
    }
    return split_round->Finish(h.client_id(), trained, weight);
  }();
  MutexLock l(&mu_);
  --accumulating_;
  cv_.SignalAll();
  TaskRecord& t = tasks_.at(h.task_id());  // still there: the round waits for us
  if (!s.ok()) {
    // Refused: the task is as it was, unless its client left meanwhile.
    t.state = TaskState::kAssigned;
    if (async()) --claimed_;
    if (!sessions_.count(t.client_id)) FailTaskLocked(h.task_id(), t, "disconnected");
    return s;
  }
  if (split) t.stats = h.split();
  t.resolved_in = current_round_;
  AcceptLocked(t, h, weight, payload.size(), *layout);
  return absl::OkStatus();
}

void Coordinator::ObserveSpeedLocked(const TaskRecord& t, const v1::UploadHeader& h) {
  auto s = sessions_.find(t.client_id);
  if (s == sessions_.end()) return;
  const double wall_s = std::chrono::duration<double>(clock_->Now() - t.sent).count();
  ClientSpeed& speed = s->second.speed;
  speed.Observe(t.steps, h.train_seconds(), wall_s);
  slowest_.step_s = std::max(slowest_.step_s, speed.step_s);
  slowest_.overhead_s = std::max(slowest_.overhead_s, speed.overhead_s);
}

void Coordinator::AcceptLocked(TaskRecord& t, const v1::UploadHeader& h, int64_t weight,
                               size_t payload_size, const ParameterSet& layout) {
  if (h.codec() != "fp32") {
    SavedUp(static_cast<int64_t>(layout.EncodedSize()) - static_cast<int64_t>(payload_size));
  }
  update_bytes_ += static_cast<int64_t>(payload_size);
  t.state = TaskState::kDone;
  t.train_loss = h.train_loss();
  t.num_examples = weight;
  t.evaluation = h.evaluation();
  if (h.evaluation().examples() > 0) clients_evaluate_ = true;
  t.train_seconds = h.train_seconds();
  t.done_at = clock_->Now();
  if (async()) ObserveSpeedLocked(t, h);
  if (t.evaluate_only) {
    spdlog::info("round {}: evaluation from {} accepted (accuracy {:.4f} on {} examples)",
                 current_round_, h.client_id(), h.evaluation().accuracy(), h.evaluation().examples());
  } else {
    spdlog::info("round {}: update from {} accepted ({} examples, weight {}, loss {:.4f}, {:.1f}s)",
                 current_round_, h.client_id(), h.num_examples(), weight, h.train_loss(),
                 h.train_seconds());
  }
  cv_.SignalAll();
}

StatusOr<std::shared_ptr<const std::string>> Coordinator::FindBlob(const v1::FetchRequest& req,
                                                                   const std::string& peer,
                                                                   int64_t* fp32_size) {
  MutexLock l(&mu_);
  RETURN_IF_ERROR(SessionLocked(req.client_id(), req.session_token(), peer).status());
  auto b = blobs_.find(req.digest());
  if (b == blobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no blob ", Printable(req.digest()), " (stale model version?)"));
  }
  auto f = fp32_sizes_.find(req.digest());
  *fp32_size = f == fp32_sizes_.end() ? static_cast<int64_t>(b->second->size()) : f->second;
  return b->second;
}

// ---------------------------------------------------------------------------------
// Setup, rounds, checkpoints.

Status Coordinator::Init() {
  MutexLock l(&mu_);  // nothing else runs yet; the annotations still hold
  if (cfg_.clients.selection == "oort") {  // JobConfig refuses it with split.mode and DP
    oort_ = std::make_unique<OortSelector>(cfg_.clients.oort_epsilon, cfg_.clients.oort_alpha,
                                           cfg_.clients.oort_pacer_rounds,
                                           cfg_.clients.oort_max_picks);
  }
  ModelSpec spec = ModelSpecOf(cfg_);
  if (cfg_.model.name == "torchscript") {
    ASSIGN_OR_RETURN(spec.torchscript, ReadFile(cfg_.model.path));
    auto blob = std::make_shared<const std::string>(spec.torchscript);
    const std::string digest = Sha256Hex(*blob);
    blobs_[digest] = blob;
    model_desc_.set_torchscript_digest(digest);
    model_desc_.set_torchscript_size(static_cast<int64_t>(blob->size()));
    pinned_blobs_.insert(digest);
  }
  model_desc_.set_name(cfg_.model.name);
  for (int64_t d : spec.input_shape) model_desc_.add_input_shape(d);
  model_desc_.set_num_classes(spec.num_classes);
  if (spec.name == "gpt") {
    v1::GptDescription* g = model_desc_.mutable_gpt();
    g->set_vocab(spec.gpt.vocab);
    g->set_context(spec.gpt.context);
    g->set_layers(spec.gpt.layers);
    g->set_heads(spec.gpt.heads);
    g->set_dim(spec.gpt.dim);
    g->set_tie(spec.gpt.tie);
  }
  if (spec.lora.enabled()) {
    v1::LoraDescription* l = model_desc_.mutable_lora();
    l->set_rank(spec.lora.rank);
    l->set_alpha(spec.lora.alpha);
    for (const std::string& t : spec.lora.targets) l->add_targets(t);
    l->set_dropout(spec.lora.dropout);
  }
  model_spec_ = spec;
  auto model = Model::Create(spec);
  if (!model.ok()) return absl::InvalidArgumentError(absl::StrCat("model: ", model.status().message()));
  model_ = *std::move(model);
  global_ = model_->Parameters();
  if (!cfg_.model.weights.empty()) {
    auto weights = LoadWeights(cfg_.model.weights, cfg_.model.name, global_);
    if (!weights.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("model.weights: ", weights.status().message()));
    }
    global_ = *std::move(weights);
  }
  if (cfg_.train.loss == "torchscript") {  // sent to clients as a blob, like a model archive
    ASSIGN_OR_RETURN(std::string archive, ReadFile(cfg_.train.loss_path));
    if (Status s = model_->SetTorchScriptLoss(archive); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("train.loss_path: ", s.message()));
    }
    auto blob = std::make_shared<const std::string>(std::move(archive));
    loss_digest_ = Sha256Hex(*blob);
    loss_size_ = static_cast<int64_t>(blob->size());
    blobs_[loss_digest_] = std::move(blob);
    pinned_blobs_.insert(loss_digest_);
  }
  if (opts_.initial_model) {
    if (opts_.evaluate && !opts_.initial_model->SameLayout(global_)) {
      return absl::InvalidArgumentError("initial_model does not match the model's layout");
    }
    global_ = *opts_.initial_model;
  }
  if (!cfg_.model.personal.empty()) {
    auto personal = MatchTensorNames(global_, cfg_.model.personal);
    if (!personal.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("model.personal: ", personal.status().message()));
    }
    personal_ = *std::move(personal);
    if (personal_.size() == global_.size()) {
      return absl::InvalidArgumentError("model.personal: matches every tensor; nothing is federated");
    }
    not_updated_ = personal_;
    for (const std::string& n : personal_) model_desc_.add_personal(n);
    spdlog::info("personal layers: {} of {} tensors stay on the clients ({})", personal_.size(),
                 global_.size(), absl::StrJoin(personal_, " "));
  }
  frozen_ = model_->FrozenTensors();
  if (!frozen_.empty()) {
    not_updated_.insert(not_updated_.end(), frozen_.begin(), frozen_.end());
    auto base = std::make_shared<const std::string>(Only(global_, frozen_).Encode());
    base_digest_ = Sha256Hex(*base);
    base_size_ = static_cast<int64_t>(base->size());
    blobs_[base_digest_] = std::move(base);
    pinned_blobs_.insert(base_digest_);
    const ParameterSet trained = Without(global_, frozen_);
    spdlog::info("LoRA: {} adapter tensors ({} values, {:.2f} % of the model) train; {} are "
                 "frozen ({} bytes, sent once in federated rounds)",
                 trained.size(), trained.total_elements(),
                 100.0 * trained.total_elements() / global_.total_elements(), frozen_.size(),
                 base_size_);
  }
  if (!not_updated_.empty()) shared_layout_ = Without(global_, not_updated_);
  if (opts_.evaluate) {
    auto test = LoadDataSpec(cfg_.data.test, /*train=*/false);
    if (!test.ok()) return absl::InvalidArgumentError(absl::StrCat("data.test: ", test.status().message()));
    test_ = *std::move(test);
    RETURN_IF_ERROR(CheckDataFitsModel(test_, spec, cfg_.train.loss, "data.test"));
    if (cfg_.data.test_limit > 0 && cfg_.data.test_limit < test_.size) {
      std::vector<int64_t> idx(cfg_.data.test_limit);
      for (int64_t i = 0; i < cfg_.data.test_limit; ++i) idx[i] = i;
      test_ = test_.Subset(idx);
    }
  }
  ASSIGN_OR_RETURN(strategy_, CreateStrategy(cfg_));
  if (cfg_.aggregation.rule == "fltrust") {
    auto root = LoadDataSpec(cfg_.aggregation.root_data, /*train=*/true);
    if (!root.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("aggregation.root_data: ", root.status().message()));
    }
    root_ = *std::move(root);
    RETURN_IF_ERROR(CheckDataFitsModel(root_, spec, cfg_.train.loss, "aggregation.root_data"));
  }
  if (CodecFamily(cfg_.compression.update) != "none") {
    auto codec = MakeCodec(cfg_.compression.update);
    if (!codec.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("compression.update: ", codec.status().message()));
    }
    update_codec_ = *std::move(codec);
  }
  if (auto c = MakeStatelessCodec(cfg_.compression.broadcast, cfg_.run.seed); !c.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("compression.broadcast: ", c.status().message()));
  } else {
    broadcast_codec_ = *std::move(c);
  }
  for (const auto& [key, codec] : {std::pair{"activations", cfg_.compression.activations},
                                   std::pair{"gradients", cfg_.compression.gradients}}) {
    if (auto c = MakeStatelessCodec(codec, 0); !c.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("compression.", key, ": ", c.status().message()));
    }
  }
  RETURN_IF_ERROR(InitSplit(spec));
  run_id_ = absl::StrCat(cfg_.run.name, "-", RandomHex(4));
  if (!opts_.run_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(opts_.run_dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", opts_.run_dir, ": ", ec.message()));
    RETURN_IF_ERROR(LoadCheckpoint());
    if (!opts_.config_text.empty()) {
      RETURN_IF_ERROR(WriteFileAtomic(Path("config.yaml"), opts_.config_text));
    }
    // Held open from now on, so that running out of descriptors (connections) cannot
    // stop a round from being recorded.
    ASSIGN_OR_RETURN(run_files_, RunFiles::Open(opts_.run_dir, "metrics.jsonl", "checkpoint.pb"));
  }
  PublishModelLocked();
  return absl::OkStatus();
}

Status Coordinator::InitSplit(const ModelSpec& spec) {
  if (!cfg_.split.enabled()) return absl::OkStatus();
  ASSIGN_OR_RETURN(SplitMode mode, ParseSplitMode(cfg_.split.mode));
  split_mode_ = mode;
  num_stages_ = model_->num_stages();
  tail_begin_ = mode == SplitMode::kUShaped ? num_stages_ - cfg_.split.tail : num_stages_;
  if (tail_begin_ < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", cfg_.model.name, " has ", num_stages_, " stages: too few to cut",
        mode == SplitMode::kUShaped ? absl::StrCat(" with split.tail ", cfg_.split.tail) : ""));
  }
  if (cfg_.split.cut >= tail_begin_) {
    return absl::InvalidArgumentError(absl::StrCat("split.cut ", cfg_.split.cut, " is not in [1, ",
                                                   tail_begin_ - 1, "] for model ",
                                                   cfg_.model.name));
  }
  // A language model reads model.gpt.context token ids and predicts one of vocab.
  const bool text = spec.name == "gpt";
  const std::vector<int64_t> sample = text ? std::vector<int64_t>{spec.gpt.context} : spec.input_shape;
  num_classes_ = text ? static_cast<int>(spec.gpt.vocab) : spec.num_classes;
  ASSIGN_OR_RETURN(server_profile_, ProfileStages(spec, sample, cfg_.train.batch_size, 3));
  stage_shapes_ = {sample};
  for (const auto& p : server_profile_) stage_shapes_.push_back(p.out_shape);
  // What the cost model needs from the model and this server; ProblemFor adds a client.
  model_problem_ = ModelCutProblem(server_profile_, sample, cfg_.train, cfg_.split.window);
  CutProblem& p = model_problem_;
  // Tensors travel in chunks (proto/split_chunks.h): a micro-batch is bounded by the
  // largest tensor the server takes, not by a message.
  p.max_message_bytes = 4 * cfg_.server.max_model_elements;
  p.tail_begin = mode == SplitMode::kUShaped ? tail_begin_ : -1;
  auto factor = [](const std::string& spec) {  // encoded / float32 bytes
    auto codec = MakeStatelessCodec(spec, 0);
    return codec.ok() && *codec ? (*codec)->EncodedSize({1 << 20}) / double{4 << 20} : 1.0;
  };
  p.activation_bytes_factor = factor(cfg_.compression.activations);
  p.gradient_bytes_factor = factor(cfg_.compression.gradients);
  if (cfg_.split.cut > 0) {  // a fixed cut must let a micro-batch through one message
    const CutPrediction r = PredictStep(p, cfg_.split.cut);
    if (!r.fits) {
      return absl::InvalidArgumentError(absl::StrCat("split.cut ", cfg_.split.cut, ": ", r.why_not,
                                                     "; lower train.batch_size or cut deeper"));
    }
  }
  auto probe = std::make_shared<const std::string>(RandomHex(kProbeBytes / 2));
  probe_digest_ = Sha256Hex(*probe);
  blobs_[probe_digest_] = probe;
  pinned_blobs_.insert(probe_digest_);
  spdlog::info("split learning: {}, {} stages, cut {}, window {}", cfg_.split.mode, num_stages_,
               cfg_.split.cut ? std::to_string(cfg_.split.cut) : "auto", cfg_.split.window);
  return absl::OkStatus();
}

void Coordinator::Revoke(std::set<std::string> revoked) {
  std::vector<std::shared_ptr<ClientLink>> cut;
  {
    MutexLock l(&mu_);
    for (const auto& name : revoked) {
      if (!revoked_.count(name)) spdlog::warn("revocation list: '{}' is revoked", Printable(name));
    }
    revoked_ = std::move(revoked);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->second.identity.empty() || !revoked_.count(it->second.identity)) {
        ++it;
        continue;
      }
      spdlog::warn("client {} ({}): certificate revoked; ending its session", it->first,
                   it->second.identity);
      FailTasksOfLocked(it->first, "certificate revoked");
      if (secagg_) secagg_->Drop(it->first);
      cut.push_back(std::move(it->second.link));
      it = sessions_.erase(it);
    }
    cv_.SignalAll();
  }
  for (auto& r : cut) {  // never start gRPC operations under mu_
    r->Close(absl::PermissionDeniedError("certificate revoked"));
  }
}

void Coordinator::PublishModelLocked() {
  ParameterSet scratch;
  auto blob = std::make_shared<const std::string>(ModelBlob(Published(global_, scratch)));
  PublishLocked(std::move(blob), Sha256Hex(*blob));
}

void Coordinator::PublishLocked(std::shared_ptr<const std::string> blob, std::string digest) {
  // Drop the previous model version; async keeps those stale tasks may still fetch.
  std::set<std::string> kept = pinned_blobs_;
  if (async()) {
    recent_models_.push_back(digest);
    while (static_cast<int>(recent_models_.size()) > cfg_.scheduler.max_staleness + 1) {
      recent_models_.pop_front();
    }
    kept.insert(recent_models_.begin(), recent_models_.end());
  }
  for (auto it = blobs_.begin(); it != blobs_.end();) {
    it = kept.count(it->first) ? std::next(it) : blobs_.erase(it);
  }
  for (auto it = fp32_sizes_.begin(); it != fp32_sizes_.end();) {
    it = kept.count(it->first) ? std::next(it) : fp32_sizes_.erase(it);
  }
  // The fp32 size of what the blob of the new model (global_) holds.
  ParameterSet scratch;
  fp32_sizes_[digest] = static_cast<int64_t>(Published(global_, scratch).EncodedSize());
  model_digest_ = std::move(digest);
  blobs_[model_digest_] = std::move(blob);
}

int Coordinator::ConnectedLocked() const {
  int n = 0;
  for (const auto& [id, s] : sessions_) n += s.ready;
  return n;
}

std::vector<std::string> Coordinator::AvailableLocked() const {
  // Sampling draws from this order, so it must not depend on the order clients joined
  // in (which decides their ids): by name, which a client chooses (sim-2 before sim-10),
  // then by id (c2 before c10) among clients of one name. A seeded run then samples the
  // same clients however their connections raced.
  std::vector<std::pair<std::string, std::string>> named;  // (name, id)
  for (const auto& [id, s] : sessions_) {
    if (s.ready && (s.has_profile || !NeedProfile())) named.emplace_back(s.name, id);
  }
  const auto numeric = [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  };
  std::sort(named.begin(), named.end(), [&](const auto& a, const auto& b) {
    return a.first != b.first ? numeric(a.first, b.first) : numeric(a.second, b.second);
  });
  std::vector<std::string> ids;
  ids.reserve(named.size());
  for (auto& [name, id] : named) ids.push_back(std::move(id));
  return ids;
}

void Coordinator::ExpireSilentLocked() {
  const auto limit = Seconds(cfg_.server.client_timeout_s);
  const auto now = clock_->Now();
  std::vector<std::shared_ptr<UploadCall>> stalled;
  {
    const auto idle = Seconds(cfg_.server.upload_idle_timeout_s);
    MutexLock u(&upload_mu_);
    for (auto& [p, r] : open_uploads_) {
      if (r->ExpireIfIdle(idle, now)) stalled.push_back(r);
    }
  }
  for (auto& r : stalled) {
    const v1::UploadHeader* h = r->header();
    spdlog::warn("upload from client {} made no progress for {:.0f}s: cancelling it",
                 h ? Printable(h->client_id()) : "(no header yet)",
                 cfg_.server.upload_idle_timeout_s);
    if (h == nullptr) continue;
    auto t = tasks_.find(h->task_id());
    if (t != tasks_.end() && t->second.client_id == h->client_id() &&
        t->second.state == TaskState::kAssigned) {
      FailTaskLocked(t->first, t->second, "its upload stalled");
      cv_.SignalAll();
    }
  }
  std::vector<std::shared_ptr<ClientLink>> silent;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (now - it->second.last_seen > limit) {
      spdlog::warn("client {} silent for {:.0f}s: dropping it", it->first,
                   cfg_.server.client_timeout_s);
      FailTasksOfLocked(it->first, "heartbeat timeout");
      silent.push_back(std::move(it->second.link));
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  if (silent.empty() && stalled.empty()) return;
  mu_.Unlock();
  for (auto& r : silent) r->Close(absl::UnavailableError("heartbeat timeout"));
  for (auto& r : stalled) r->Cancel();
  mu_.Lock();
}

bool Coordinator::RoundResolvedLocked() const {
  for (const auto& [id, t] : tasks_) {
    if (t.state == TaskState::kAssigned || t.state == TaskState::kAccumulating) return false;
  }
  return true;
}

v1::ServerMessage Coordinator::MakeTaskLocked(int64_t round, const std::string& cid,
                                               const FitSettings& fit, int64_t deadline_ms) {
  v1::ServerMessage msg;
  v1::Task* task = msg.mutable_task();
  task->set_run_id(run_id_);
  task->set_round(round);
  task->set_task_id(absl::StrCat("r", round, "-", cid));
  *task->mutable_model() = model_desc_;
  auto* tc = task->mutable_train();
  tc->set_local_epochs(fit.local_epochs);
  tc->set_batch_size(fit.batch_size);
  tc->set_lr(fit.lr);
  tc->set_momentum(fit.momentum);
  tc->set_weight_decay(fit.weight_decay);
  tc->set_proximal_mu(fit.proximal_mu);
  tc->set_optimizer(fit.optimizer);
  tc->set_loss(fit.loss);
  tc->set_loss_digest(loss_digest_);
  tc->set_loss_size(loss_size_);
  tc->set_nesterov(fit.nesterov);
  tc->set_local_steps(fit.local_steps);
  tc->set_clip_norm(fit.clip_norm);
  tc->set_label_smoothing(fit.label_smoothing);
  tc->set_seed(edge_fit_ ? edge_seed_ : cfg_.run.seed * 1000003 + round);
  task->set_deadline_unix_ms(deadline_ms);
  TaskRecord rec;
  rec.client_id = cid;
  rec.round = round;
  if (async()) {  // a client may get several tasks while one version is built
    task->set_task_id(absl::StrCat("r", round, "-", cid, "-", ++task_seq_));
    rec.sent = clock_->Now();
    rec.deadline = rec.sent + Seconds(cfg_.clients.round_deadline_s);
    // Staleness control: as many steps as the client can do while about
    // target_staleness versions are applied. A client not measured yet is taken to be
    // as slow as the slowest one measured (train's work while none is).
    const Session& s = sessions_[cid];
    const int64_t base = TaskSteps(fit.local_steps, fit.local_epochs,
                                   std::max<int64_t>(1, s.num_examples), fit.batch_size);
    double interval_s = 0;  // the mean of the last buffers'
    for (double b : recent_intervals_) interval_s += b / recent_intervals_.size();
    rec.steps = SizedSteps(base, cfg_.scheduler.min_local_steps, cfg_.scheduler.target_staleness,
                           interval_s, s.speed.step_s > 0 ? s.speed : slowest_);
    if (rec.steps != base) tc->set_local_steps(rec.steps);
  }
  if (evaluating_) {
    task->set_task_id(absl::StrCat("e", round, "-", cid));
    task->set_evaluate_only(true);
    task->set_base_digest(base_digest_);
    task->set_base_size(base_size_);
    task->set_model_digest(model_digest_);
    task->set_model_size(static_cast<int64_t>(blobs_[model_digest_]->size()));
    if (broadcast_codec_) task->set_model_codec(cfg_.compression.broadcast);
    rec.evaluate_only = true;
    rec.expected_size = static_cast<int64_t>(ParameterSet().EncodedSize());
    tasks_[task->task_id()] = std::move(rec);
    return msg;
  }
  if (split_round_) {
    // The client part, published as a blob of its own. Parts at the same cut are the
    // same tensors, so the round builds, encodes and hashes each cut's once (in sl each
    // turn has its own: the clients before it changed it).
    rec.split = true;
    rec.cut = *split_round_->CutOf(cid);
    PartBlob turn;
    PartBlob& pb = *split_mode_ == SplitMode::kSl ? turn : part_blobs_[rec.cut];
    if (!pb.part) {
      ParameterSet part = *split_round_->ClientPart(cid);
      // LoRA: the part's adapters travel (down and up); its frozen tensors come from a
      // base of the part's own frozen tensors (the same every round: pinned), which the
      // client fetches once per cut.
      if (!frozen_.empty()) {
        auto& base = cut_bases_[rec.cut];
        if (base.first.empty()) {
          auto blob = std::make_shared<const std::string>(Only(part, frozen_).Encode());
          base = {Sha256Hex(*blob), static_cast<int64_t>(blob->size())};
          blobs_[base.first] = std::move(blob);
          pinned_blobs_.insert(base.first);
        }
        part = Without(part, frozen_);
      }
      auto blob = std::make_shared<const std::string>(ModelBlob(part));
      pb.digest = Sha256Hex(*blob);
      pb.size = static_cast<int64_t>(blob->size());
      blobs_[pb.digest] = std::move(blob);
      fp32_sizes_[pb.digest] = static_cast<int64_t>(part.EncodedSize());
      pb.part = std::make_shared<const ParameterSet>(std::move(part));
    }
    rec.part = pb.part;
    if (!frozen_.empty()) {
      task->set_base_digest(cut_bases_[rec.cut].first);
      task->set_base_size(cut_bases_[rec.cut].second);
    }
    task->set_model_digest(pb.digest);
    task->set_model_size(pb.size);
    rec.expected_size = static_cast<int64_t>(rec.part->EncodedSize());
    auto* st = task->mutable_split();
    st->set_mode(cfg_.split.mode);
    st->set_cut(rec.cut);
    st->set_tail_begin(tail_begin_);
    st->set_num_stages(num_stages_);
    st->set_window(cfg_.split.window);
    st->set_activation_codec(SplitCodec(cfg_.compression.activations));
    st->set_gradient_codec(SplitCodec(cfg_.compression.gradients));
    st->set_activation_noise(cfg_.split.activation_noise);
    st->set_nopeek(cfg_.split.nopeek);
  } else {
    task->set_base_digest(base_digest_);
    task->set_base_size(base_size_);
    task->set_model_digest(model_digest_);
    task->set_model_size(static_cast<int64_t>(blobs_[model_digest_]->size()));
    rec.expected_size = static_cast<int64_t>(UpdateLayout().EncodedSize());
  }
  if (broadcast_codec_) task->set_model_codec(cfg_.compression.broadcast);
  if (update_codec_) {
    rec.codec = cfg_.compression.update;
    rec.expected_size = EncodedTensorsSize(*update_codec_, rec.split ? *rec.part : UpdateLayout());
    task->set_update_codec(rec.codec);
  }
  if (secagg_) {
    rec.codec = kSecAggCodec;
    rec.expected_size = secagg_->PayloadSize();
    *task->mutable_secagg() = secagg_->TaskMessage();
  }
  if (cfg_.dp.enabled && cfg_.dp.noise == "distributed") {
    // Each client's share of the noise: n shares sum to N(0, (z C)^2).
    task->mutable_dp()->set_clip(cfg_.dp.clip);
    task->mutable_dp()->set_noise_stddev(cfg_.dp.noise_multiplier * cfg_.dp.clip /
                                         std::sqrt(static_cast<double>(round_clients_)));
  }
  tasks_[task->task_id()] = std::move(rec);
  return msg;
}

CutProblem Coordinator::ProblemFor(const Session& s, int clients_in_round) const {
  CutProblem p = model_problem_;
  p.client_stage_s.assign(s.profile.stage_seconds().begin(), s.profile.stage_seconds().end());
  // One shared server part runs one step at a time; per-client copies share the pool.
  p.server_load = *split_mode_ == SplitMode::kSflV1
                      ? std::max(1.0, static_cast<double>(clients_in_round) /
                                          cfg_.server.worker_threads)
                      : clients_in_round;
  p.up_bps = s.profile.uplink_bytes_per_s();
  p.down_bps = s.profile.downlink_bytes_per_s();
  p.rtt_s = s.profile.rtt_s();
  p.memory_limit_bytes = s.profile.memory_limit_bytes();
  return p;
}

StatusOr<std::vector<std::string>> Coordinator::BeginSplitRoundLocked(
    int64_t round, const std::vector<std::string>& clients, const FitSettings& fit) {
  part_blobs_.clear();
  std::map<std::string, int> cuts;
  std::vector<std::string> chosen;
  // In sl the clients take turns, one at a time, so the server serves one at a time.
  const int concurrent = *split_mode_ == SplitMode::kSl ? 1 : static_cast<int>(clients.size());
  for (const auto& cid : clients) {
    Session& s = sessions_[cid];
    if (!s.has_profile) {  // a fixed cut needs no profile
      cuts[cid] = cfg_.split.cut;
      chosen.push_back(cid);
      continue;
    }
    auto policy = cfg_.split.cut ? MakeFixedPolicy(cfg_.split.cut) : MakeCostModelPolicy();
    auto choice = policy->Choose(s.feedback.Apply(ProblemFor(s, concurrent)));
    if (!choice.ok()) {
      spdlog::warn("round {}: client {} ({}) left out: {}", round, cid, s.name,
                   std::string(choice.status().message()));
      continue;
    }
    s.prediction = *choice;
    cuts[cid] = choice->cut;
    chosen.push_back(cid);
    spdlog::info("round {}: client {} ({}) cut at {} by {}: predicted step {:.1f} ms (client "
                 "{:.1f}, up {:.1f}, server {:.1f}, down {:.1f}), client memory {} KiB",
                 round, cid, s.name, choice->cut, policy->name(), 1e3 * choice->step_s,
                 1e3 * choice->client_s, 1e3 * choice->up_s, 1e3 * choice->server_s,
                 1e3 * choice->down_s, choice->client_memory_bytes >> 10);
  }
  if (chosen.empty()) return absl::AbortedError(absl::StrCat("round ", round, ": no client to cut for"));
  SplitRoundOptions o;
  o.mode = *split_mode_;
  o.model = model_spec_;
  o.training = ServerTraining(fit, cfg_.run.seed);
  o.num_stages = num_stages_;
  o.tail_begin = tail_begin_;
  o.max_batch = fit.batch_size;
  o.num_classes = num_classes_;
  o.stage_input_shapes = stage_shapes_;
  ASSIGN_OR_RETURN(auto split_round, SplitRound::Create(std::move(o), global_, cuts));
  split_round_ = std::move(split_round);
  return chosen;
}

StatusOr<RoundMetrics> Coordinator::RunRound(bool evaluate_only) {
  const int64_t round = evaluate_only ? committed_round_ : committed_round_ + 1;
  RETURN_IF_ERROR(AwaitClientsLocked());

  const auto start = clock_->Now();  // wall_s: from sampling to commit
  RoundPlan plan;
  if (evaluate_only) {  // every connected client; the strategy's state is left alone
    plan.clients = AvailableLocked();
    plan.fit.loss = cfg_.train.loss;
  } else {
    plan = strategy_->ConfigureRound(round, AvailableLocked(), rng_);
    if (oort_) {  // the same number of clients, picked by utility and speed
      std::multimap<std::string, std::string> ids;  // name -> session id
      std::vector<std::string> names;
      for (const auto& cid : AvailableLocked()) {
        ids.emplace(sessions_[cid].name, cid);
        names.push_back(sessions_[cid].name);
      }
      std::sort(names.begin(), names.end());
      names.erase(std::unique(names.begin(), names.end()), names.end());
      const int k = static_cast<int>(plan.clients.size());
      plan.clients.clear();
      for (const auto& name : oort_->Select(names, k, round, rng_)) {
        plan.clients.push_back(ids.find(name)->second);
      }
      std::sort(plan.clients.begin(), plan.clients.end());
    }
  }
  if (!plan.stop_reason.empty()) return absl::OutOfRangeError(plan.stop_reason);
  if (edge_fit_) plan.fit = *edge_fit_;  // an edge trains as its upstream says
  round_clients_ = std::max<int>(1, plan.clients.size());
  {
    std::vector<int64_t> declared;
    for (const auto& cid : plan.clients) declared.push_back(sessions_[cid].num_examples);
    round_weights_ = RoundWeights(cfg_.aggregation, declared);
  }
  if (!evaluate_only) strategy_->BeginRound(UpdateLayout());
  evaluating_ = evaluate_only;
  tasks_.clear();
  turns_.clear();
  current_round_ = round;
  bytes_up_ = 0;
  bytes_down_ = 0;
  split_up_ = 0;
  split_down_ = 0;
  labels_up_ = 0;
  saved_up_ = 0;
  update_bytes_ = 0;
  saved_down_ = 0;
  if (split_mode_) {
    auto clients = BeginSplitRoundLocked(round, plan.clients, plan.fit);
    if (!clients.ok()) {
      current_round_ = 0;
      return clients.status();
    }
    plan.clients = *std::move(clients);
  }
  if (cfg_.secure_aggregation.enabled) {
    if (Status s = BeginSecAggLocked(round, plan.clients); !s.ok()) {
      current_round_ = 0;
      return s;
    }
  }
  const auto deadline = clock_->Now() + Seconds(cfg_.clients.round_deadline_s);
  const int64_t deadline_ms = UnixMs() + static_cast<int64_t>(cfg_.clients.round_deadline_s * 1000);
  // sl: one client at a time, each continuing from the previous one's client part.
  const bool in_turns = split_mode_ == SplitMode::kSl;
  std::vector<std::string> first = plan.clients;
  if (in_turns) {
    turns_.assign(plan.clients.begin() + 1, plan.clients.end());
    first.resize(1);
  }
  SendTasksLocked(round, first, plan.fit, deadline_ms);
  spdlog::info("round {}: {} clients selected", round, plan.clients.size());
  phase_ = evaluate_only ? "evaluating" : "training";
  int lost_turns = 0;  // sl: clients gone before their turn came
  Status secagg_status = secagg_ ? RunSecAggStagesLocked(deadline) : absl::OkStatus();
  while (!secagg_ && !stopping_ && clock_->Now() < deadline) {
    if (RoundResolvedLocked()) {
      if (turns_.empty()) break;
      std::string next = turns_.front();
      turns_.pop_front();
      if (sessions_.count(next)) {
        SendTasksLocked(round, {next}, plan.fit, deadline_ms);
      } else {
        spdlog::warn("round {}: client {} left before its turn", round, next);
        ++lost_turns;
      }
      continue;
    }
    WaitLocked(deadline);
    ExpireSilentLocked();
  }
  // Uploads past their checks are being validated and added outside the lock: they end
  // (accepted or refused) before the round closes. CPU work, not a wait on a client.
  while (accumulating_ > 0) cv_.Wait(&mu_);
  evaluating_ = false;
  if (stopping_) {
    current_round_ = 0;
    return absl::CancelledError("stopped");
  }
  // Close the round: anything still assigned is a straggler and counts as failed.
  RoundMetrics m;
  m.round = round;
  m.failures = lost_turns;
  double loss_sum = 0;
  int64_t weight = 0;
  for (const auto& cid : turns_) {  // sl: clients whose turn never came
    spdlog::warn("round {}: client {} never got its turn", round, cid);
    ++m.failures;
  }
  turns_.clear();
  std::vector<const TaskRecord*> evaluated;
  for (auto& [id, t] : tasks_) {
    if (t.state == TaskState::kAssigned) FailTaskLocked(id, t, "missed the round's deadline");
    if (oort_ && !t.evaluate_only && sessions_.count(t.client_id)) {
      const std::string& name = sessions_[t.client_id].name;
      if (t.state == TaskState::kDone) {
        oort_->Observe(name, round, static_cast<double>(t.num_examples) * t.train_loss,
                       std::chrono::duration<double>(t.done_at - start).count());
      } else {
        oort_->MissedDeadline(name, round, cfg_.clients.round_deadline_s);
      }
    }
    if (t.state == TaskState::kDone) {
      ++m.participants;
      loss_sum += t.train_loss * t.num_examples;
      weight += t.num_examples;
      if (t.evaluation.examples() > 0) evaluated.push_back(&t);
    } else {
      ++m.failures;
    }
    if (!t.split) continue;
    auto s = sessions_.find(t.client_id);
    const std::string name = s != sessions_.end() ? s->second.name : t.client_id;
    m.cuts[name] = t.cut;
    if (t.state != TaskState::kDone) continue;
    m.step_s += t.stats.wall_s();
    m.client_compute_s += t.stats.client_compute_s();
    m.transfer_s += t.stats.transfer_s();
    m.server_compute_s += t.stats.server_compute_s();
    if (s != sessions_.end() && s->second.prediction.cut == t.cut) {
      auto& session = s->second;
      spdlog::info("round {}: client {} at cut {}: predicted step {:.1f} ms, measured {:.1f} ms "
                   "(client {:.1f}, transfer {:.1f}, server {:.1f})",
                   round, name, t.cut, 1e3 * session.prediction.step_s, 1e3 * t.stats.wall_s(),
                   1e3 * t.stats.client_compute_s(), 1e3 * t.stats.transfer_s(),
                   1e3 * t.stats.server_compute_s());
      session.feedback.Observe(session.prediction, t.stats.client_compute_s(),
                               t.stats.transfer_s(), t.stats.server_compute_s());
    }
  }
  if (oort_ && !evaluate_only) oort_->EndRound();
  m.client_eval = SummariseEvaluations(evaluated);
  if (split_mode_) {
    m.split = true;
    m.activation_bytes_up = split_up_;
    m.gradient_bytes_down = split_down_;
    m.labels_up = labels_up_;
    if (split_round_) {
      const SplitRound::Load load = split_round_->ServerLoad();
      m.server_busy = load.span_s > 0 ? load.busy_s / load.span_s : 0;
    }
    if (m.participants > 0) {
      m.step_s /= m.participants;
      m.client_compute_s /= m.participants;
      m.transfer_s /= m.participants;
      m.server_compute_s /= m.participants;
    }
  }
  current_round_ = 0;
  std::unique_ptr<SecAggRound> secagg = std::move(secagg_);
  mu_.Unlock();
  CancelOpenUploads();  // late or stalled uploads of the round just closed
  DropBuffers();        // not held while the next model is built beside the current one
  mu_.Lock();
  RETURN_IF_ERROR(secagg_status);  // nothing of an aborted secure aggregation is used
  const int selected = std::max<int>(1, plan.clients.size());
  const int quorum = std::max(1, static_cast<int>(std::ceil(cfg_.clients.quorum * selected)));
  m.bytes_up = bytes_up_;
  m.bytes_down = bytes_down_;
  m.bytes_up_fp32 = m.bytes_up + saved_up_;
  m.update_bytes = update_bytes_;
  m.bytes_down_fp32 = m.bytes_down + saved_down_;
  if (m.participants < quorum && !evaluate_only) {
    return absl::AbortedError(absl::StrCat("round ", round, ": ", m.participants, " of ",
                                           selected, " results, quorum is ", quorum));
  }
  if (evaluate_only) {  // clients without held-out data decline; any result counts
    if (m.participants == 0) return absl::AbortedError("no client evaluated the model");
    m.evaluation_only = true;
    m.wall_s = std::chrono::duration<double>(clock_->Now() - start).count();
    return m;
  }
  m.train_loss = weight ? loss_sum / weight : 0;
  m.examples = weight;
  std::shared_ptr<SplitRound> split_round = std::move(split_round_);
  RETURN_IF_ERROR(ApplyLocked(
      round, split_round, [&](const ParameterSet& layout) -> Status {
        if (secagg) RETURN_IF_ERROR(AccumulateSecAgg(*secagg, weight, layout));
        if (root_.size > 0) RETURN_IF_ERROR(SetFlTrustReference(RunThreadGlobal(), plan.fit));
        return absl::OkStatus();
      }, &m));
  m.wall_s = std::chrono::duration<double>(clock_->Now() - start).count();
  return m;
}

Status Coordinator::ApplyLocked(int64_t round, std::shared_ptr<SplitRound> split_round,
                                const std::function<Status(const ParameterSet&)>& fold,
                                RoundMetrics* m) {
  // The server update, encoding and hashing of a large model take a while: do them on a
  // copy without the lock. No upload touches the strategy meanwhile (the round is
  // closed, or the async buffer is being applied), and readers of global_ see the
  // previous model.
  ParameterSet next = not_updated_.empty() ? global_ : Without(global_, not_updated_);
  mu_.Unlock();
  Status finished = absl::OkStatus();
  // The strategy's state before it steps (server momentum, Adam moments, the DP
  // accountant, error-feedback memory): a round that fails after the step leaves no
  // trace in it.
  std::optional<ParameterSet> strategy_before;
  if (split_round) {
    auto aggregated = split_round->Aggregate();
    finished = aggregated.status();
    if (aggregated.ok()) next = *std::move(aggregated);
  } else {
    strategy_before = strategy_->State();
    if (fold) finished = fold(next);
    if (finished.ok()) finished = strategy_->FinishRound(m->failures, &next);
    if (finished.ok()) m->strategy_stats = strategy_->RoundStats();
    if (finished.ok() && !not_updated_.empty()) {  // the shared tensors into the whole model
      ParameterSet whole = RunThreadGlobal();
      finished = Overwrite(next, &whole);
      next = std::move(whole);
    }
  }
  if (finished.ok()) {
    // Never commit (nor checkpoint, nor send) a model that is not finite, whatever
    // produced it: the round fails and is retried from the previous model.
    if (Status finite = CheckViews(next, ViewsOf(next)); !finite.ok()) {
      finished = absl::AbortedError(absl::StrCat("round ", round, ": the aggregate is not usable (",
                                                 finite.message(), "); not committed"));
    }
  }
  if (!finished.ok() && strategy_before) {
    if (Status s = strategy_->Restore(*strategy_before); !s.ok()) {
      finished = absl::InternalError(absl::StrCat(finished.message(),
                                                  "; the strategy's state was not restored: ",
                                                  s.message()));
    }
  }
  std::shared_ptr<const std::string> blob;
  std::string digest;
  if (finished.ok()) {
    ParameterSet scratch;
    blob = std::make_shared<const std::string>(ModelBlob(Published(next, scratch)));
    digest = Sha256Hex(*blob);
  }
  mu_.Lock();
  RETURN_IF_ERROR(finished);
  global_ = std::move(next);
  committed_round_ = round;
  PublishLocked(std::move(blob), std::move(digest));
  return absl::OkStatus();
}

void Coordinator::SendTasksLocked(int64_t round, const std::vector<std::string>& cids,
                                  const FitSettings& fit, int64_t deadline_ms) {
  std::vector<std::pair<std::shared_ptr<ClientLink>, v1::ServerMessage>> sends;
  for (const std::string& cid : cids) {
    sends.emplace_back(sessions_[cid].link, MakeTaskLocked(round, cid, fit, deadline_ms));
  }
  mu_.Unlock();  // never start gRPC operations under mu_
  std::vector<std::string> unsent;
  for (auto& [link, msg] : sends) {
    if (!link->Send(msg)) unsent.push_back(msg.task().task_id());
  }
  mu_.Lock();
  for (const auto& id : unsent) {
    auto t = tasks_.find(id);
    if (t != tasks_.end() && t->second.state == TaskState::kAssigned) {
      FailTaskLocked(id, t->second, "control stream closed");
    }
  }
}

Status Coordinator::OpenBufferLocked(int64_t version) {
  RoundPlan plan = strategy_->ConfigureBuffer(version);
  if (!plan.stop_reason.empty()) return absl::OutOfRangeError(plan.stop_reason);
  buffer_fit_ = plan.fit;
  std::vector<int64_t> declared;
  for (const auto& cid : AvailableLocked()) declared.push_back(sessions_[cid].num_examples);
  // The cap follows the connected clients; with none connected the last one holds.
  if (!declared.empty()) round_weights_ = RoundWeights(cfg_.aggregation, declared);
  strategy_->BeginRound(UpdateLayout());
  current_round_ = version;
  claimed_ = 0;
  applying_ = false;
  buffer_start_ = clock_->Now();
  bytes_up_ = 0;
  bytes_down_ = 0;
  saved_up_ = 0;
  saved_down_ = 0;
  update_bytes_ = 0;
  // Finished tasks are kept while an upload of theirs could still arrive (a retried
  // upload is a duplicate, not an unknown task); a task given in version r is refused
  // as too stale once r < version - max_staleness.
  for (auto it = tasks_.begin(); it != tasks_.end();) {
    const bool finished = it->second.state == TaskState::kDone || it->second.state == TaskState::kFailed;
    if (finished && it->second.round < version - cfg_.scheduler.max_staleness) {
      it = tasks_.erase(it);
    } else {
      ++it;
    }
  }
  // Tasks that can no longer be accepted fail now, so that their clients get new work.
  for (auto& [id, t] : tasks_) {
    if (t.state == TaskState::kAssigned && version - t.round > cfg_.scheduler.max_staleness) {
      FailTaskLocked(id, t, absl::StrCat("too stale: more than scheduler.max_staleness=",
                                         cfg_.scheduler.max_staleness,
                                         " versions were applied since it was given"));
    }
  }
  cv_.SignalAll();  // uploads waiting for a buffer
  return absl::OkStatus();
}

void Coordinator::DispatchLocked() {
  const int cap = cfg_.scheduler.concurrency > 0 ? cfg_.scheduler.concurrency : INT_MAX;
  std::set<std::string> busy;  // clients with a task in flight
  std::set<std::string> in_buffer;  // dp: clients whose update is in the open buffer
  for (const auto& [id, t] : tasks_) {
    if (t.state == TaskState::kAssigned || t.state == TaskState::kAccumulating) {
      busy.insert(t.client_id);
    } else if (cfg_.dp.enabled && t.state == TaskState::kDone && t.resolved_in == current_round_) {
      in_buffer.insert(t.client_id);
    }
  }
  const int free = cap - static_cast<int>(busy.size());
  if (free <= 0) return;
  std::vector<std::string> idle;
  for (const auto& cid : AvailableLocked()) {
    if (!busy.count(cid) && !in_buffer.count(cid)) idle.push_back(cid);
  }
  if (idle.empty()) return;
  const int k = std::min<int>(free, idle.size());
  for (int i = 0; i < k; ++i) {  // the first k of a seeded shuffle
    std::uniform_int_distribution<size_t> pick(i, idle.size() - 1);
    std::swap(idle[i], idle[pick(rng_)]);
  }
  idle.resize(k);
  const int64_t deadline_ms = UnixMs() + static_cast<int64_t>(cfg_.clients.round_deadline_s * 1000);
  SendTasksLocked(current_round_, idle, buffer_fit_, deadline_ms);
}

StatusOr<RoundMetrics> Coordinator::RunBufferLocked() {
  const int64_t round = committed_round_ + 1;
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(AvailableLocked().size()) >= cfg_.clients.min_clients;
  };
  auto in_flight = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [id, t] : tasks_) {
      if (t.state == TaskState::kAssigned || t.state == TaskState::kAccumulating) return true;
    }
    return false;
  };
  // The first buffer of a run (or after a failed one) waits for clients.min; later ones
  // opened as the one before was applied.
  if (current_round_ != round) {
    RETURN_IF_ERROR(AwaitClientsLocked());
    RETURN_IF_ERROR(OpenBufferLocked(round));
  }
  phase_ = "training (async)";
  const int k = cfg_.scheduler.buffer_size;
  auto short_since = clock_->Now();  // when the federation last had clients.min
  while (!stopping_ && !(claimed_ >= k && accumulating_ == 0)) {
    const auto now = clock_->Now();
    auto wake = now + Seconds(cfg_.clients.round_deadline_s);
    for (auto& [id, t] : tasks_) {
      if (t.state != TaskState::kAssigned) continue;
      if (now >= t.deadline) {
        FailTaskLocked(id, t, "missed its deadline");
      } else {
        wake = std::min(wake, t.deadline);
      }
    }
    DispatchLocked();
    if (enough() || in_flight()) {
      short_since = now;
    } else if (now > short_since + Seconds(cfg_.clients.join_timeout_s)) {
      current_round_ = 0;
      cv_.SignalAll();
      return absl::DeadlineExceededError(absl::StrCat(
          "version ", round, ": fewer than clients.min=", cfg_.clients.min_clients,
          " clients connected for ", cfg_.clients.join_timeout_s, "s"));
    } else {
      wake = std::min(wake, short_since + Seconds(cfg_.clients.join_timeout_s));
    }
    WaitLocked(wake);
    ExpireSilentLocked();
  }
  if (stopping_) {
    current_round_ = 0;
    cv_.SignalAll();
    return absl::CancelledError("stopped");
  }
  // The buffer is full and nothing is being added: apply it. Uploads wait meanwhile.
  applying_ = true;
  RoundMetrics m;
  m.round = round;
  m.async = true;
  double loss_sum = 0;
  int64_t weight = 0;
  for (const auto& [id, t] : tasks_) {
    if (t.resolved_in != round) continue;
    if (t.state == TaskState::kDone) {
      m.local_steps_min = m.participants ? std::min(m.local_steps_min, t.steps) : t.steps;
      m.local_steps_max = std::max(m.local_steps_max, t.steps);
      m.local_steps_mean += static_cast<double>(t.steps);
      ++m.participants;
      ++m.staleness[t.staleness];
      loss_sum += t.train_loss * t.num_examples;
      weight += t.num_examples;
    } else if (t.state == TaskState::kFailed) {
      ++m.failures;
    }
  }
  m.train_loss = weight ? loss_sum / weight : 0;
  if (m.participants) m.local_steps_mean /= m.participants;
  m.examples = weight;
  m.bytes_up = bytes_up_;
  m.bytes_down = bytes_down_;
  m.bytes_up_fp32 = m.bytes_up + saved_up_;
  m.bytes_down_fp32 = m.bytes_down + saved_down_;
  m.update_bytes = update_bytes_;
  const auto start = buffer_start_;
  if (Status s = ApplyLocked(round, nullptr, nullptr, &m); !s.ok()) {
    // The buffer is dropped; RunBufferLocked opens it again (Run retries).
    current_round_ = 0;
    applying_ = false;
    cv_.SignalAll();
    return s;
  }
  m.wall_s = std::chrono::duration<double>(clock_->Now() - start).count();
  // The buffer opened when the version before was applied: wall_s is the interval.
  // Staleness control uses the mean of the last 10 (single buffers' vary several-fold).
  recent_intervals_.push_back(m.wall_s);
  if (recent_intervals_.size() > 10) recent_intervals_.pop_front();
  if (round < cfg_.run.rounds) {
    // The next buffer opens before this version is evaluated and checkpointed. If the
    // strategy ends the run first (a privacy budget), none opens and the next
    // RunBufferLocked call says why.
    if (!OpenBufferLocked(round + 1).ok()) current_round_ = 0;
  } else {
    current_round_ = 0;
  }
  applying_ = false;
  cv_.SignalAll();
  return m;
}

Status Coordinator::AwaitClientsLocked() {
  phase_ = "waiting for clients";
  const auto deadline = clock_->Now() + Seconds(cfg_.clients.join_timeout_s);
  while (!stopping_ && static_cast<int>(AvailableLocked().size()) < cfg_.clients.min_clients) {
    if (clock_->Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "only ", AvailableLocked().size(), " of clients.min=", cfg_.clients.min_clients,
          " clients connected", NeedProfile() ? " and profiled" : "", " within ",
          cfg_.clients.join_timeout_s, "s"));
    }
    WaitLocked(deadline);
    ExpireSilentLocked();
  }
  return stopping_ ? absl::CancelledError("stopped") : absl::OkStatus();
}

StatusOr<int64_t> Coordinator::WaitForClients() {
  MutexLock l(&mu_);
  RETURN_IF_ERROR(AwaitClientsLocked());
  int64_t examples = 0;
  for (const auto& cid : AvailableLocked()) examples += sessions_[cid].num_examples;
  phase_ = "idle";
  return examples;
}

StatusOr<EdgeRound> Coordinator::RunEdgeRound(const ParameterSet& start, const FitSettings& fit,
                                              uint64_t seed) {
  UseTorchThreads();  // called on the upstream client's thread
  StatusOr<RoundMetrics> m;
  {
    MutexLock l(&mu_);
    if (!not_updated_.empty()) {
      return absl::FailedPreconditionError(
          "an edge aggregator's model has no personal or frozen tensors");
    }
    if (!start.SameLayout(global_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the upstream's model has another layout than this server's model.name=",
          cfg_.model.name));
    }
    RETURN_IF_ERROR(CheckViews(start, ViewsOf(start)));
    global_ = start;
    PublishModelLocked();
    edge_fit_ = fit;
    edge_seed_ = seed;
    m = RunRound();
    edge_fit_.reset();
  }
  DropBuffers();
  RETURN_IF_ERROR(m.status());
  RETURN_IF_ERROR(Commit(&*m));
  EdgeRound r;
  r.delta = GlobalModel();
  for (size_t i = 0; i < r.delta.size(); ++i) {
    auto& v = r.delta.mutable_tensors()[i].values;
    const auto& s = start.tensors()[i].values;
    for (size_t j = 0; j < v.size(); ++j) v[j] -= s[j];
  }
  r.examples = m->examples;
  r.metrics = *std::move(m);
  return r;
}

Status Coordinator::BeginSecAggLocked(int64_t round, const std::vector<std::string>& clients) {
  const auto& c = cfg_.secure_aggregation;
  const uint64_t levels = (uint64_t{1} << c.bits) - 1;
  if (levels * clients.size() >= c.modulus) {
    return absl::FailedPreconditionError(absl::StrCat(
        "secure_aggregation.modulus ", c.modulus, " is too small for ", clients.size(),
        " clients of 2^", c.bits, " levels each: sums would wrap"));
  }
  // Updates are weighted by examples, except under DP, where every clipped update counts
  // the same (max_weight 1: every client's scale is 1).
  int64_t max_weight = 1;
  if (!UniformSecAggWeights()) {
    for (const auto& cid : clients) {
      max_weight = std::max(max_weight, round_weights_.Weight(sessions_[cid].num_examples));
    }
  }
  secagg_ = std::make_unique<SecAggRound>(c, absl::StrCat(run_id_, "|round ", round), clients,
                                          UpdateLayout().total_elements(), max_weight, rng_());
  return absl::OkStatus();
}

Status Coordinator::RunSecAggStagesLocked(Clock::time_point training_deadline) {
  const auto timeout = Seconds(cfg_.secure_aggregation.stage_timeout_s);
  auto stage_deadline = clock_->Now() + timeout;
  while (secagg_->stage() != SecAggRound::Stage::kDone) {
    if (stopping_) return absl::CancelledError("stopped");
    const bool training = secagg_->stage() == SecAggRound::Stage::kMasked;
    const auto until = training ? training_deadline : stage_deadline;
    if (!secagg_->StageComplete() && clock_->Now() < until) {
      WaitLocked(until);
      ExpireSilentLocked();
      continue;
    }
    const char* closing = SecAggRound::StageName(secagg_->stage());
    auto next = secagg_->CloseStage();
    if (!next.ok()) {
      spdlog::warn("round {}: {}", current_round_, std::string(next.status().message()));
      return next.status();
    }
    spdlog::info("round {}: secure aggregation stage '{}' closed; '{}' next for {} clients",
                 current_round_, closing, SecAggRound::StageName(secagg_->stage()), next->size());
    phase_ = absl::StrCat("secure aggregation: ", SecAggRound::StageName(secagg_->stage()));
    std::vector<std::pair<std::string, std::shared_ptr<ClientLink>>> to;
    for (auto& [cid, msg] : *next) {
      const std::string task_id = absl::StrCat("r", current_round_, "-", cid);
      if (msg.has_secagg_neighbours()) msg.mutable_secagg_neighbours()->set_task_id(task_id);
      if (msg.has_secagg_relay()) msg.mutable_secagg_relay()->set_task_id(task_id);
      if (msg.has_secagg_unmask()) msg.mutable_secagg_unmask()->set_task_id(task_id);
      auto s = sessions_.find(cid);
      if (s == sessions_.end()) {
        secagg_->Drop(cid);
      } else {
        to.emplace_back(cid, s->second.link);
      }
    }
    mu_.Unlock();  // never start gRPC operations under mu_
    std::vector<std::string> unsent;
    for (auto& [cid, link] : to) {
      if (!link->Send((*next)[cid])) unsent.push_back(cid);
    }
    mu_.Lock();
    for (const auto& cid : unsent) {
      if (secagg_) secagg_->Drop(cid);
    }
    stage_deadline = clock_->Now() + timeout;
  }
  return absl::OkStatus();
}

Status Coordinator::AccumulateSecAgg(const SecAggRound& round, int64_t total_examples,
                                      const ParameterSet& layout) {
  ASSIGN_OR_RETURN(SecAggRound::Result r, round.Finish());
  if (total_examples <= 0) return absl::AbortedError("secure aggregation: no survivors' weight");
  // Clients sent n_u / max_weight * x_u: the weighted mean is the sum over the survivors'
  // total weight in the same units (or, with uniform weights, over their number).
  const double scale = UniformSecAggWeights()
                           ? 1.0 / r.survivors.size()
                           : static_cast<double>(round.TaskMessage().max_weight()) / total_examples;
  ParameterSet mean = layout;
  size_t i = 0;
  for (auto& t : mean.mutable_tensors()) {
    for (float& v : t.values) v = static_cast<float>(r.sum[i++] * scale);
  }
  // Under distributed DP the weight is the number of clients in the sum (the DP
  // strategy's n); otherwise their examples.
  strategy_->Accumulate(ViewsOf(mean), UniformSecAggWeights()
                                           ? static_cast<int64_t>(r.survivors.size())
                                           : total_examples);
  spdlog::info("secure aggregation: unmasked the sum of {} updates", r.survivors.size());
  return absl::OkStatus();
}

Status Coordinator::SetFlTrustReference(const ParameterSet& global, const FitSettings& fit) {
  RETURN_IF_ERROR(model_->SetParameters(global));
  const LocalTrainOptions o = ServerTraining(fit, cfg_.run.seed);
  RETURN_IF_ERROR(model_->Train(root_, o).status());
  ParameterSet update = Without(model_->Parameters(), not_updated_);
  const ParameterSet base = Without(global, not_updated_);
  for (size_t i = 0; i < update.size(); ++i) {
    auto& v = update.mutable_tensors()[i].values;
    for (size_t j = 0; j < v.size(); ++j) v[j] -= base.tensors()[i].values[j];
  }
  double sq = 0;
  for (const auto& t : update.tensors()) {
    for (float v : t.values) sq += static_cast<double>(v) * v;
  }
  spdlog::info("fltrust: server update on {} root examples, {} epochs, norm {:.4f}", root_.size,
               o.epochs, std::sqrt(sq));
  strategy_->SetReference(update);
  return absl::OkStatus();
}

void Coordinator::FinalEvaluation(double elapsed_s) {
  StatusOr<RoundMetrics> m;
  {
    MutexLock l(&mu_);
    // Not in split rounds nor under secure aggregation: clients report no evaluation
    // there (one client's numbers would show what masking hides).
    // A run restarted after its final evaluation does not repeat it.
    if (!cfg_.server.final_evaluation || !clients_evaluate_ || split_mode_ ||
        cfg_.secure_aggregation.enabled || stopping_ ||
        final_evaluated_round_ == committed_round_) {
      return;
    }
    spdlog::info("final evaluation of round {}'s model by the clients", committed_round_);
    m = RunRound(/*evaluate_only=*/true);
  }
  if (!m.ok()) {
    spdlog::warn("final evaluation: {}", std::string(m.status().message()));
    return;
  }
  m->elapsed_s = elapsed_s;
  spdlog::info("final evaluation: accuracy {:.4f}, loss {:.4f} on {} examples of {} clients",
               m->client_eval.accuracy, m->client_eval.loss, m->client_eval.examples,
               m->client_eval.clients);
  {
    MutexLock l(&mu_);
    total_bytes_up_ += m->bytes_up;
    total_bytes_down_ += m->bytes_down;
    history_.push_back(*m);
    final_evaluated_round_ = m->round;
  }
  if (opts_.run_dir.empty()) return;
  if (Status s = run_files_->AppendLog(MetricsJson(*m)); !s.ok()) {
    spdlog::warn("final evaluation not recorded: {}", std::string(s.message()));
  }
}

Status Coordinator::Commit(RoundMetrics* m) {
  // Called without mu_ held: evaluation and disk writes take a while, and the transport must
  // not wait for them.
  if (opts_.evaluate) {
    RETURN_IF_ERROR(model_->SetParameters(GlobalModel()));
    ASSIGN_OR_RETURN(EvalStats ev, model_->Evaluate(test_, cfg_.server.eval_batch_size, cfg_.train.loss));
    m->evaluated = true;
    m->test_accuracy = ev.accuracy;
    m->test_loss = ev.loss;
    m->test_metrics = ev.metrics;
    m->test_per_class_accuracy = ev.per_class_accuracy;
  }
  std::string checkpoint;
  {
    MutexLock l(&mu_);
    total_bytes_up_ += m->bytes_up;
    total_bytes_down_ += m->bytes_down;
    last_accuracy_ = m->test_accuracy;
    history_.push_back(*m);
    if (!opts_.run_dir.empty()) checkpoint = CheckpointLocked(m->elapsed_s);
  }
  if (opts_.run_dir.empty()) return absl::OkStatus();
  // Metrics first: on resume, lines of rounds after the checkpoint are dropped.
  RETURN_IF_ERROR(run_files_->AppendLog(MetricsJson(*m)));
  return run_files_->ReplaceState(checkpoint);
}

std::string Coordinator::CheckpointLocked(double elapsed_s) const {
  Checkpoint ck;
  ck.run_id = run_id_;
  ck.round = committed_round_;
  ParameterSet scratch;
  ck.global = Published(global_, scratch);  // exact, whatever the broadcast codec
  {
    // async: uploads are added into the next buffer while this checkpoint is taken.
    MutexLock a(&accumulate_mu_);
    ck.strategy_state = strategy_->State();
  }
  ck.rng = rng_;
  ck.bytes_up = total_bytes_up_;
  ck.bytes_down = total_bytes_down_;
  ck.wall_s = elapsed_s;
  if (oort_) ck.oort = oort_->state();
  return EncodeCheckpoint(ck);
}

Status Coordinator::LoadCheckpoint() {
  const std::string path = Path("checkpoint.pb");
  if (!std::filesystem::exists(path)) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  // Every error names the file: the operator must know what to inspect or remove.
  auto in_file = [&](const Status& s) {
    return Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  auto decoded = DecodeCheckpoint(bytes);
  if (!decoded.ok()) return in_file(decoded.status());
  Checkpoint& ck = *decoded;
  ParameterSet scratch;
  if (!ck.global.SameLayout(Published(global_, scratch))) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " holds a model of another layout than model.name=", cfg_.model.name,
                     frozen_.empty() ? "" : " with these LoRA adapters"));
  }
  if (Status s = strategy_->Restore(ck.strategy_state); !s.ok()) return in_file(s);
  if (frozen_.empty()) {
    global_ = std::move(ck.global);
  } else {
    RETURN_IF_ERROR(in_file(Overwrite(ck.global, &global_)));  // the adapters on the base
  }
  rng_ = ck.rng;
  run_id_ = ck.run_id;
  committed_round_ = ck.round;
  total_bytes_up_ = ck.bytes_up;
  total_bytes_down_ = ck.bytes_down;
  prior_elapsed_s_ = ck.wall_s;
  if (oort_ && ck.oort) oort_->Restore(std::move(*ck.oort));
  spdlog::info("resuming run {} after round {}", run_id_, committed_round_);
  return TrimMetrics();
}

Status Coordinator::TrimMetrics() {
  const std::string path = Path("metrics.jsonl");
  auto text = ReadFile(path);
  if (!text.ok()) return absl::OkStatus();  // no metrics yet
  std::string kept;
  std::istringstream lines(*text);
  for (std::string line; std::getline(lines, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || j.value("round", int64_t{0}) > committed_round_) continue;
    if (j.value("evaluation_only", false)) final_evaluated_round_ = j.value("round", int64_t{0});
    if (j.contains("client_eval")) clients_evaluate_ = true;  // for the final evaluation
    kept += line + "\n";
  }
  if (kept.size() == text->size()) return absl::OkStatus();
  spdlog::warn("dropping metrics of rounds after the checkpoint (round {})", committed_round_);
  return WriteFileAtomic(path, kept);
}

Status Coordinator::Run() {
  UseTorchThreads();  // Run may be called on any thread
  const auto start = clock_->Now();
  auto elapsed = [&] {
    return prior_elapsed_s_ + std::chrono::duration<double>(clock_->Now() - start).count();
  };
  if (committed_round() == 0 && opts_.evaluate) {  // baseline: the initial model
    RoundMetrics m0;
    RETURN_IF_ERROR(model_->SetParameters(GlobalModel()));
    ASSIGN_OR_RETURN(EvalStats ev,
                     model_->Evaluate(test_, cfg_.server.eval_batch_size, cfg_.train.loss));
    spdlog::info("initial model: test accuracy {:.4f}, loss {:.4f}", ev.accuracy, ev.loss);
    MutexLock l(&mu_);
    last_accuracy_ = ev.accuracy;
  }
  Status result = absl::OkStatus();
  std::string stop_reason;  // a strategy's reason to end the run early
  int failed_in_a_row = 0;
  while (true) {
    StatusOr<RoundMetrics> m;
    {
      MutexLock l(&mu_);
      if (stopping_) {
        result = absl::CancelledError("stopped before the last round");
        break;
      }
      if (committed_round_ >= cfg_.run.rounds) break;
      m = async() ? RunBufferLocked() : RunRound();
    }
    DropBuffers();  // what late uploads of the last round returned
    if (!m.ok()) {
      if (m.status().code() == absl::StatusCode::kOutOfRange) {  // the strategy ended the run
        spdlog::info("run ends early: {}", std::string(m.status().message()));
        stop_reason = std::string(m.status().message());
        break;
      }
      if (m.status().code() == absl::StatusCode::kAborted && ++failed_in_a_row < 5) {
        spdlog::warn("{}; retrying the round", std::string(m.status().message()));
        continue;
      }
      result = m.status();
      break;
    }
    failed_in_a_row = 0;
    m->elapsed_s = elapsed();
    if (Status s = Commit(&*m); !s.ok()) {
      result = s;
      break;
    }
    spdlog::info(
        "round {} committed: accuracy {:.4f}, test loss {:.4f}, train loss {:.4f}, "
        "{} participants, {} failures, {} B up, {} B down, {:.1f}s",
        m->round, m->test_accuracy, m->test_loss, m->train_loss, m->participants, m->failures,
        m->bytes_up, m->bytes_down, m->wall_s);
  }
  if (result.ok()) FinalEvaluation(elapsed());
  if (result.code() == absl::StatusCode::kCancelled) {
    // Stopped, not finished: a server restarted on the same run directory resumes the
    // run, so its clients should keep trying to reconnect rather than exit.
    DisconnectClients();
  } else {
    EndRun(!result.ok() ? std::string(result.message())
                        : stop_reason.empty() ? "completed"
                                              : "completed early: " + stop_reason);
  }
  return result;
}

void Coordinator::DisconnectClients() {
  std::vector<std::shared_ptr<ClientLink>> links;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    phase_ = "stopped";
    for (auto& [id, s] : sessions_) links.push_back(s.link);
  }
  for (auto& r : links) {
    r->Close(absl::UnavailableError("the server is stopping; reconnect to resume the run"));
  }
}

void Coordinator::EndRun(const std::string& reason) {
  std::vector<std::shared_ptr<ClientLink>> links;
  v1::ServerMessage msg;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    phase_ = "ended";
    for (auto& [id, s] : sessions_) links.push_back(s.link);
    msg.mutable_run_ended()->set_run_id(run_id_);
    msg.mutable_run_ended()->set_reason(reason);
  }
  for (auto& r : links) r->Send(msg, /*finish_after=*/true);
  // Give clients a moment to read RunEnded, then stop serving: a grace period of real
  // time for the network, not a protocol deadline.
  MutexLock l(&mu_);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!sessions_.empty() && !cv_.WaitUntil(&mu_, until)) {
  }
}

void Coordinator::Stop() {
  MutexLock l(&mu_);
  stopping_ = true;
  cv_.SignalAll();
}

Coordinator::~Coordinator() { Stop(); }

int Coordinator::SetMaxSessions(int derived) {
  MutexLock l(&mu_);
  max_sessions_ = cfg_.server.max_sessions > 0 ? cfg_.server.max_sessions : derived;
  return max_sessions_;
}

void Coordinator::FillStatus(v1::StatusReply* reply) const {
  MutexLock l(&mu_);
  reply->set_run_id(run_id_);
  reply->set_round(current_round_ ? current_round_ : committed_round_);
  reply->set_total_rounds(cfg_.run.rounds);
  reply->set_connected_clients(ConnectedLocked());
  reply->set_phase(phase_);
  reply->set_last_test_accuracy(last_accuracy_);
}

}  // namespace cleave
