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
#include "proto/train_config.h"
#include "server/scheduler.h"
#include "server/gossip_driver.h"
#include "server/metrics_json.h"
#include "server/secagg_driver.h"
#include "server/split_driver.h"

namespace cleave {

// Constant-time comparison, so response timing does not leak a token byte by byte.
bool TokenMatches(const std::string& expected, const std::string& given) {
  return expected.size() == given.size() &&
         CRYPTO_memcmp(expected.data(), given.data(), expected.size()) == 0;
}

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

namespace {

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

}  // namespace

int64_t Coordinator::UnixMsIn(double seconds) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
             .count() +
         static_cast<int64_t>(seconds * 1000);
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
  if (join.peer_address().size() > 256 || Printable(join.peer_address(), 256) != join.peer_address() ||
      (!join.peer_address().empty() && join.peer_address().rfind(':') == std::string::npos)) {
    return absl::InvalidArgumentError("Join.peer_address must be host:port, printable, <= 256 bytes");
  }
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
        driver_->ClientLeftLocked(it->first);
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
    s.peer_address = join.peer_address();
    s.link = std::move(link);
    s.last_seen = clock_->Now();
    welcome->set_run_id(run_id_);
    welcome->set_client_id(s.id);
    welcome->set_session_token(s.token);
    welcome->set_name(s.name);
    welcome->set_heartbeat_interval_ms(static_cast<int>(cfg_.server.heartbeat_s * 1000));
    if (NeedProfile()) {
      *welcome->mutable_model() = model_desc_;
      welcome->set_profile_batch_size(cfg_.train.batch_size);
      welcome->set_probe_digest(split_->probe_digest());
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
  driver_->ClientLeftLocked(it->first);
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
  if (auto s = sessions_.find(t.client_id); s != sessions_.end()) ++s->second.failures;
  driver_->TaskFailedLocked(t);
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
  if (!secagg_) return absl::FailedPreconditionError("this run has no secure aggregation");
  secagg_->mu().AssertHeld();  // this->mu_
  return secagg_->SubmitLocked(req);
}

Status Coordinator::SetProfile(const std::string& client_id, const v1::Profile& p) {
  if (!NeedProfile()) return absl::OkStatus();  // nothing to decide from it
  if (p.stage_seconds_size() != split_->num_stages()) {
    return absl::InvalidArgumentError(absl::StrCat("profile has ", p.stage_seconds_size(),
                                                   " stage times, the model ",
                                                   split_->num_stages()));
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
  if (!split_) return absl::FailedPreconditionError("this run is not split learning");
  split_->mu().AssertHeld();  // this->mu_
  return split_->OpenLocked(open);
}

void Coordinator::SplitEnded(const SplitStreamTask& task, const Status& why) {
  MutexLock l(&mu_);
  if (!split_) return;
  split_->mu().AssertHeld();  // this->mu_
  split_->EndedLocked(task, why);
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
  RETURN_IF_ERROR(scheduler_->CheckRoundLocked(what, round));
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
  if (t->second.gossip) {
    const auto& g = h.gossip();
    if (g.neighbours() < 0 || g.heard() < 0 || g.heard() > g.neighbours() ||
        g.neighbours() > 1024 || g.bytes_sent() < 0 || g.bytes_received() < 0 ||
        !std::isfinite(g.disagreement()) || g.disagreement() < 0 ||
        !std::isfinite(g.uplink_mbps()) || g.uplink_mbps() < 0) {
      return absl::InvalidArgumentError(
          "gossip stats: counts and bytes must be >= 0, heard <= neighbours <= 1024, "
          "disagreement and uplink_mbps finite and >= 0");
    }
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
  // kAccumulating (the schedulers wait for accumulating_ to reach 0 before they close
  // it), so the layout (global_ or shared_layout_) and the strategy's round do not
  // change meanwhile.
  const ParameterSet* layout = nullptr;
  float scale = 1.0f;
  RoundDriver::AddUpload add;  // the driver's, when it adds the update itself
  ClientUpdate update;
  std::optional<BufferEntry> record;  // what the scheduler records of it
  {
    MutexLock l(&mu_);
    // Re-check under the lock: the round may have closed while we were reading.
    const bool open = scheduler_->OpenForLocked(h.round());
    auto t = tasks_.find(h.task_id());
    if (!open || t == tasks_.end() || t->second.client_id != h.client_id()) {
      return absl::FailedPreconditionError(
          absl::StrCat("round ", h.round(), " closed before the upload completed"));
    }
    TaskRecord& task = t->second;
    RETURN_IF_ERROR(TaskTakesUpload(h.task_id(), task, duplicate));
    if (*duplicate) return absl::OkStatus();
    if (task.evaluate_only && h.evaluation().examples() == 0) {
      return absl::InvalidArgumentError("an evaluation task's upload must carry its evaluation");
    }
    ASSIGN_OR_RETURN(scale, scheduler_->AdmitLocked(h.task_id(), task, h));
    layout = task.split ? task.part.get() : task.evaluate_only ? &kNothing : &UpdateLayout();
    const int64_t weight = round_weights_.Weight(h.num_examples());
    Status taken;
    if (driver_->TakeLocked(h, payload, task, &taken)) {  // a masked input, added whole
      if (!taken.ok()) {
        scheduler_->UnadmitLocked();
        return taken;
      }
      AcceptLocked(task, h, weight, payload.size(), *layout);
      return absl::OkStatus();
    }
    if (task.evaluate_only) {  // nothing to add
      AcceptLocked(task, h, weight, payload.size(), *layout);
      return absl::OkStatus();
    }
    add = driver_->ClaimUploadLocked(task);
    update.client_id = h.client_id();
    auto s = sessions_.find(h.client_id());
    update.client_name = s != sessions_.end() ? s->second.name : h.client_id();
    update.base_version = task.round - 1;
    update.staleness = task.staleness;
    update.weight = weight;
    update.train_loss = h.train_loss();
    if (scheduler_->Records()) {
      record.emplace();
      record->version = current_round_;
      record->task_round = task.round;
      record->staleness = task.staleness;
      record->weight = weight;
      record->scale = scale;
      record->train_loss = h.train_loss();
      record->steps = task.steps;
      record->client_name = update.client_name;
      record->codec = h.codec();
    }
    task.state = TaskState::kAccumulating;
    ++accumulating_;
  }
  // Model-sized work without the coordinator's lock: uploads are checked and added in
  // parallel on the workers, each into its own partial sum (shard_mu_).
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
    for (auto& v : views) v.scale = scale;
    if (record) {  // durable before it is added (async: the buffer survives a crash)
      record->payload = payload;
      RETURN_IF_ERROR(scheduler_->Record(*record));
    }
    if (add) return add(views, update.weight);
    update.delta = std::move(views);
    // Each worker adds into its own partial sum; threads outside the pool share the last.
    const int w = pool_.WorkerIndex();
    const int shard = w >= 0 ? w : shards_ - 1;
    MutexLock a(&shard_mu_[shard]);
    strategy_->Accumulate(update, shard);
    return absl::OkStatus();
  }();
  MutexLock l(&mu_);
  --accumulating_;
  cv_.SignalAll();
  TaskRecord& t = tasks_.at(h.task_id());  // still there: the round waits for us
  if (!s.ok()) {
    // Refused: the task is as it was, unless its client left meanwhile.
    t.state = TaskState::kAssigned;
    scheduler_->UnadmitLocked();
    if (!sessions_.count(t.client_id)) FailTaskLocked(h.task_id(), t, "disconnected");
    return s;
  }
  if (t.split) t.stats = h.split();
  t.resolved_in = current_round_;
  AcceptLocked(t, h, update.weight, payload.size(), *layout);
  return absl::OkStatus();
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
  if (h.has_gossip()) t.gossip_stats = h.gossip();
  if (auto s = sessions_.find(t.client_id); s != sessions_.end() && !t.evaluate_only) {
    ++s->second.done;
    s->second.task_s = h.train_seconds();
    if (t.split) s->second.step_s = h.split().wall_s();
  }
  t.done_at = clock_->Now();
  scheduler_->AcceptedLocked(t, h);
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
  ChooseRoundsLocked();
  ASSIGN_OR_RETURN(const ModelSpec spec, LoadModelLocked());
  RETURN_IF_ERROR(SplitLayoutLocked());
  RETURN_IF_ERROR(LoadDataLocked(spec));
  ASSIGN_OR_RETURN(strategy_, opts_.strategy ? opts_.strategy(cfg_) : CreateStrategy(cfg_));
  RETURN_IF_ERROR(MakeCodecs());
  if (split_) {
    split_->mu().AssertHeld();  // this->mu_
    RETURN_IF_ERROR(split_->Init(spec));
  }
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
    if (async_) {
      async_->mu().AssertHeld();  // this->mu_
      RETURN_IF_ERROR(async_->OpenJournal(opts_.run_dir, committed_round_));
    }
  }
  PublishModelLocked();
  return absl::OkStatus();
}

void Coordinator::ChooseRoundsLocked() {
  // How rounds run: the kind of round (its driver), and who schedules versions.
  if (cfg_.split.enabled()) {
    split_ = std::make_unique<SplitDriver>(*this);
    mode_driver_ = split_.get();
  } else if (cfg_.secure_aggregation.enabled) {
    secagg_ = std::make_unique<SecAggDriver>(*this);
    mode_driver_ = secagg_.get();
  } else if (cfg_.scheduler.gossip()) {
    gossip_ = std::make_unique<GossipDriver>(*this);
    mode_driver_ = gossip_.get();
  }
  if (cfg_.split.enabled() && cfg_.split.mode == "sl") {
    rounds_ = std::make_unique<TurnRounds>(*this, *mode_driver_);
  } else {
    rounds_ = std::make_unique<SyncRounds>(*this, *mode_driver_);
  }
  if (cfg_.scheduler.async()) {
    async_ = std::make_unique<AsyncBuffers>(*this);
    scheduler_ = async_.get();
  } else {
    scheduler_ = rounds_.get();
  }
  if (cfg_.clients.selection == "oort") {  // JobConfig refuses it with split.mode and DP
    oort_ = std::make_unique<OortSelector>(cfg_.clients.oort_epsilon, cfg_.clients.oort_alpha,
                                           cfg_.clients.oort_pacer_rounds,
                                           cfg_.clients.oort_max_picks);
  }
}

StatusOr<ModelSpec> Coordinator::LoadModelLocked() {
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
  DescribeModelLocked(spec);
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
  return spec;
}

void Coordinator::DescribeModelLocked(const ModelSpec& spec) {
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
}

Status Coordinator::SplitLayoutLocked() {
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
  return absl::OkStatus();
}

Status Coordinator::LoadDataLocked(const ModelSpec& spec) {
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
  if (cfg_.aggregation.rule == "fltrust") {
    auto root = LoadDataSpec(cfg_.aggregation.root_data, /*train=*/true);
    if (!root.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("aggregation.root_data: ", root.status().message()));
    }
    root_ = *std::move(root);
    RETURN_IF_ERROR(CheckDataFitsModel(root_, spec, cfg_.train.loss, "aggregation.root_data"));
  }
  return absl::OkStatus();
}

Status Coordinator::MakeCodecs() {
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
      driver_->ClientLeftLocked(it->first);
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
  // Drop older model versions, but for those tasks may still fetch (async).
  std::set<std::string> kept = pinned_blobs_;
  recent_models_.push_back(digest);
  while (static_cast<int>(recent_models_.size()) > scheduler_->VersionsKept()) {
    recent_models_.pop_front();
  }
  kept.insert(recent_models_.begin(), recent_models_.end());
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

bool Coordinator::NeedProfile() const { return split_ && split_->NeedProfile(); }

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
  const std::vector<std::shared_ptr<UploadCall>> stalled =
      uploads_.ExpireIdle(Seconds(cfg_.server.upload_idle_timeout_s), now);
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
  ToProto(fit, tc);
  tc->set_loss_digest(loss_digest_);
  tc->set_loss_size(loss_size_);
  tc->set_seed(edge_fit_ ? edge_seed_ : cfg_.run.seed * 1000003 + round);
  task->set_deadline_unix_ms(deadline_ms);
  TaskRecord rec;
  rec.client_id = cid;
  rec.round = round;
  scheduler_->ShapeTaskLocked(sessions_[cid], fit, task, &rec);
  task->set_base_digest(base_digest_);
  task->set_base_size(base_size_);
  task->set_model_digest(model_digest_);
  task->set_model_size(static_cast<int64_t>(blobs_[model_digest_]->size()));
  if (broadcast_codec_) task->set_model_codec(cfg_.compression.broadcast);
  if (evaluating_) {
    task->set_task_id(absl::StrCat("e", round, "-", cid));
    task->set_evaluate_only(true);
    rec.evaluate_only = true;
    rec.expected_size = static_cast<int64_t>(ParameterSet().EncodedSize());
    tasks_[task->task_id()] = std::move(rec);
    return msg;
  }
  rec.expected_size = update_codec_ ? EncodedTensorsSize(*update_codec_, UpdateLayout())
                                    : static_cast<int64_t>(UpdateLayout().EncodedSize());
  if (update_codec_) {
    rec.codec = cfg_.compression.update;
    task->set_update_codec(rec.codec);
  }
  driver_->PrepareTaskLocked(task, &rec);  // split: the client part; SecAgg: masked inputs
  if (cfg_.dp.enabled && cfg_.dp.noise == "distributed") {
    // Each client's share of the noise: n shares sum to N(0, (z C)^2).
    task->mutable_dp()->set_clip(cfg_.dp.clip);
    task->mutable_dp()->set_noise_stddev(cfg_.dp.noise_multiplier * cfg_.dp.clip /
                                         std::sqrt(static_cast<double>(round_clients_)));
  }
  tasks_[task->task_id()] = std::move(rec);
  return msg;
}

Status Coordinator::ApplyLocked(int64_t round,
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
  const ParameterSet strategy_before = strategy_->State();
  if (fold) finished = fold(next);
  if (finished.ok()) finished = strategy_->FinishRound(m->failures, &next);
  if (finished.ok()) m->strategy_stats = strategy_->RoundStats();
  if (finished.ok() && !not_updated_.empty()) {  // the shared tensors into the whole model
    ParameterSet whole = RunThreadGlobal();
    finished = Overwrite(next, &whole);
    next = std::move(whole);
  }
  if (finished.ok()) {
    // Never commit (nor checkpoint, nor send) a model that is not finite, whatever
    // produced it: the round fails and is retried from the previous model.
    if (Status finite = CheckViews(next, ViewsOf(next)); !finite.ok()) {
      finished = absl::AbortedError(absl::StrCat("round ", round, ": the aggregate is not usable (",
                                                 finite.message(), "); not committed"));
    }
  }
  if (!finished.ok()) {
    if (Status s = strategy_->Restore(strategy_before); !s.ok()) {
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
                                  const RoundPlan& plan, int64_t deadline_ms) {
  std::vector<std::pair<std::shared_ptr<ClientLink>, v1::ServerMessage>> sends;
  for (const std::string& cid : cids) {
    sends.emplace_back(sessions_[cid].link,
                       MakeTaskLocked(round, cid, plan.FitFor(cid), deadline_ms));
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

void Coordinator::OpenRoundLocked(int64_t round) {
  tasks_.clear();
  current_round_ = round;
  ResetRoundBytes();
}

void Coordinator::ResetRoundBytes() {
  bytes_up_ = 0;
  bytes_down_ = 0;
  split_up_ = 0;
  split_down_ = 0;
  labels_up_ = 0;
  saved_up_ = 0;
  saved_down_ = 0;
  update_bytes_ = 0;
}

void Coordinator::CountRoundBytesLocked(RoundMetrics* m) const {
  m->bytes_up = bytes_up_;
  m->bytes_down = bytes_down_;
  m->bytes_up_fp32 = m->bytes_up + saved_up_;
  m->bytes_down_fp32 = m->bytes_down + saved_down_;
  m->update_bytes = update_bytes_;
}

void Coordinator::AwaitAccumulatingLocked() {
  while (accumulating_ > 0) cv_.Wait(&mu_);
}

void Coordinator::AccumulateUnnamed(std::vector<TensorView> delta, int64_t weight) {
  MutexLock a(&shard_mu_[0]);
  strategy_->Accumulate(ClientUpdate::Unnamed(std::move(delta), weight), 0);
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
    rounds_->mu().AssertHeld();  // this->mu_
    m = rounds_->NextLocked();
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

Status Coordinator::SetFlTrustReference(const ParameterSet& global, const FitSettings& fit) {
  RETURN_IF_ERROR(model_->SetParameters(global));
  const LocalTrainOptions o(fit, cfg_.run.seed);
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
               o.local_epochs, std::sqrt(sq));
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
    if (!cfg_.server.final_evaluation || !clients_evaluate_ || !mode_driver_->ClientsEvaluate() ||
        stopping_ ||
        final_evaluated_round_ == committed_round_) {
      return;
    }
    spdlog::info("final evaluation of round {}'s model by the clients", committed_round_);
    rounds_->mu().AssertHeld();  // this->mu_
    m = rounds_->EvaluateLocked();
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
  if (Status s = run_files_->AppendLog(RoundMetricsJson(*m).dump()); !s.ok()) {
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
  RETURN_IF_ERROR(run_files_->AppendLog(RoundMetricsJson(*m).dump()));
  return run_files_->ReplaceState(checkpoint);
}

ParameterSet Coordinator::StrategyState() const {
  // async: uploads are added into the next buffer while a checkpoint is taken.
  for (int i = 0; i < shards_; ++i) shard_mu_[i].Lock();
  ParameterSet state = strategy_->State();
  for (int i = shards_ - 1; i >= 0; --i) shard_mu_[i].Unlock();
  return state;
}

std::string Coordinator::CheckpointLocked(double elapsed_s) const {
  Checkpoint ck;
  ck.run_id = run_id_;
  ck.round = committed_round_;
  ParameterSet scratch;
  ck.global = Published(global_, scratch);  // exact, whatever the broadcast codec
  ck.strategy_state = StrategyState();
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
      m = scheduler_->NextLocked();
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
    scheduler_->Committed(m->round);
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

Coordinator::Coordinator(ServerOptions o)
    : opts_(std::move(o)),
      cfg_(opts_.config),
      clock_(opts_.clock ? opts_.clock : Clock::Real()),
      rng_(cfg_.run.seed),
      shards_(cfg_.server.worker_threads + 1),
      shard_mu_(new Mutex[shards_]),
      uploads_(cfg_.server.worker_threads),
      pool_(cfg_.server.worker_threads, UseTorchThreads) {}

Coordinator::~Coordinator() { Stop(); }

int Coordinator::SetMaxSessions(int derived) {
  MutexLock l(&mu_);
  max_sessions_ = cfg_.server.max_sessions > 0 ? cfg_.server.max_sessions : derived;
  return max_sessions_;
}

ObservedState Coordinator::Observe(bool history) const {
  ObservedState o;
  {
    MutexLock l(&mu_);
    o.run_id = run_id_;
    o.phase = phase_;
    o.committed_round = committed_round_;
    o.current_round = current_round_;
    o.total_rounds = cfg_.run.rounds;
    if (history) o.history = history_;
    for (const auto& m : history_) o.task_failures += m.failures;
    for (auto m = history_.rbegin(); m != history_.rend(); ++m) {
      if (!m->evaluation_only) {
        o.last_round = *m;
        break;
      }
    }
    std::map<std::string, TaskState> busy;  // by client: its task in flight, if any
    for (const auto& [id, t] : tasks_) {
      if (t.state == TaskState::kAssigned || t.state == TaskState::kAccumulating) {
        busy[t.client_id] = t.state;
      }
    }
    const auto now = clock_->Now();
    for (const auto& [id, s] : sessions_) {
      ClientHealth c;
      c.name = s.name;
      c.id = id;
      auto b = busy.find(id);
      c.state = b == busy.end() ? "idle"
                : b->second == TaskState::kAccumulating ? "adding"
                                                        : "training";
      c.last_seen_s = std::chrono::duration<double>(now - s.last_seen).count();
      c.task_s = s.task_s;
      c.step_s = s.step_s;
      c.uplink_mbps = s.profile.uplink_bytes_per_s() * 8 / 1e6;
      c.downlink_mbps = s.profile.downlink_bytes_per_s() * 8 / 1e6;
      c.cut = s.prediction.cut;
      c.done = s.done;
      c.failures = s.failures;
      o.clients.push_back(std::move(c));
    }
  }
  std::sort(o.clients.begin(), o.clients.end(),
            [](const ClientHealth& a, const ClientHealth& b) { return a.name < b.name; });
  o.bytes_up = lifetime_up_;
  o.bytes_down = lifetime_down_;
  const Server::UploadCounts u = Uploads();
  o.uploads_in_progress = u.in_progress;
  o.uploads_queued = u.queued;
  o.rss_bytes = ResidentBytes();
  o.upload_s = upload_latency_.Get();
  o.fetch_s = fetch_latency_.Get();
  o.config_yaml = opts_.config_text;
  return o;
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
