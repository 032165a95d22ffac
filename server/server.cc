#include "server/server.h"
#include "server/accept_gate.h"
#include "server/checkpoint.h"
#include "server/secagg_round.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <malloc.h>
#include <sys/resource.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <cstring>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "aggregation/strategy.h"
#include "aggregation/weighting.h"
#include "compression/codec.h"
#include "cleave/v1/cleave.grpc.pb.h"
#include "absl/base/thread_annotations.h"
#include "core/clock.h"
#include "core/files.h"
#include "core/mutex.h"
#include "core/printable.h"
#include "core/thread_pool.h"
#include "data/dataset.h"
#include "models/model.h"
#include "models/part.h"
#include "models/safetensors.h"
#include "privacy/tls.h"
#include "proto/split_chunks.h"
#include "split/cut_policy.h"
#include "split/round.h"

namespace cleave {

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

// Constant-time comparison, so response timing does not leak a token byte by byte.
bool TokenMatches(const std::string& expected, const std::string& given) {
  return expected.size() == given.size() &&
         CRYPTO_memcmp(expected.data(), given.data(), expected.size()) == 0;
}

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The CN of the call's verified client certificate; empty without mutual TLS.
std::string PeerIdentity(const grpc::CallbackServerContext* ctx) {
  const auto auth = ctx->auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return "";
  const auto cn = auth->FindPropertyValues("x509_common_name");
  return cn.empty() ? "" : std::string(cn[0].data(), cn[0].size());
}

// The codec name of a masked secure-aggregation input in UploadHeader.codec.
constexpr char kSecAggCodec[] = "secagg";

// A reactor that ends its call at once with `status` (a call refused before any work).
template <class Reactor>
class Refusal final : public Reactor {
 public:
  explicit Refusal(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

grpc::Status ToGrpc(const Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
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
  for (const auto& [k, v] : m.strategy_stats) j[k] = v;
  return j.dump();
}

class ControlReactor;
class UploadReactor;

// What a message takes on the transport: its protobuf encoding, gRPC's 5-byte message
// prefix and a 9-byte HTTP/2 frame header per started 16 KiB DATA frame. Checked against
// the bytes a TCP proxy counts (tests/integration/traffic_test.cc).
int64_t WireSize(int64_t encoded_bytes) {
  const int64_t n = encoded_bytes + 5;
  return n + 9 * ((n + 16383) / 16384);
}
int64_t WireSize(const google::protobuf::MessageLite& m) {
  return WireSize(static_cast<int64_t>(m.ByteSizeLong()));
}
// Each call's HTTP/2 HEADERS frames (method, path, content type, deadline; then status
// and trailers), HPACK-compressed after a connection's first call, plus the stream's
// share of flow-control frames: measured on loopback, see traffic_test.cc.
constexpr int64_t kCallBytesUp = 60, kCallBytesDown = 40;
// A client's first call also opens its connection: the HTTP/2 preface, SETTINGS and
// headers not yet in the HPACK table.
constexpr int64_t kConnectionBytesUp = 220;

enum class TaskState { kAssigned, kDone, kFailed };

struct TaskRecord {
  std::string client_id;
  TaskState state = TaskState::kAssigned;
  double train_loss = 0;
  int64_t num_examples = 0;   // the update's weight (RoundWeights), once done
  int64_t expected_size = 0;   // bytes of the update
  std::string codec = "fp32";  // its codec: fp32 (a parameter-set encoding) or a Codec spec
  // Split tasks: the client part the client was given, without frozen tensors (its
  // upload is a delta from it); shared by the round's tasks at the same cut.
  bool split = false;
  bool split_open = false;
  int cut = 0;
  std::shared_ptr<const ParameterSet> part;
  v1::SplitStats stats;
  // Federated evaluation reported with the upload; examples = 0 when none.
  v1::ClientEvaluation evaluation;
  double train_seconds = 0;
  bool evaluate_only = false;  // an evaluation task: its upload is an empty parameter set
};

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

// What a split stream works on; fixed when the stream opens.
struct SplitStreamTask {
  std::string client_id;
  std::string task_id;
  std::shared_ptr<SplitRound> round;
  int window = 1;
  int64_t max_elements = 0;
  std::string act_codec, grad_codec;  // "" = float32
};

struct Session {
  std::string id;
  std::string name;
  std::string identity;  // the CN of its client certificate (mutual TLS), else empty
  std::string token;
  int64_t num_examples = 0;
  std::shared_ptr<ControlReactor> reactor;
  bool ready = false;  // Welcome queued: tasks may follow it
  Clock::time_point last_seen;
  // Split learning with cut: auto.
  bool has_profile = false;
  v1::Profile profile;
  CutFeedback feedback;
  CutPrediction prediction;  // of the last round's cut
};

// The round's local training settings as the server trains with them: FLTrust's
// reference update and the server's parts of a cut model (clients get the same through
// their task's TrainConfig).
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

// ---------------------------------------------------------------------------------
// Shared state and round logic. Reactors call into it; the Run() thread drives rounds.
// Fetch is a raw method: downloads are written as byte buffers whose data slices point
// into the shared blob (FetchReactor), so no download copies the model.
class Server::Impl final
    : public v1::Coordinator::WithRawCallbackMethod_Fetch<v1::Coordinator::CallbackService> {
 public:
  explicit Impl(ServerOptions o)
      : opts_(std::move(o)),
        cfg_(opts_.config),
        clock_(opts_.clock ? opts_.clock : Clock::Real()),
        rng_(cfg_.run.seed),
        upload_slots_free_(cfg_.server.worker_threads),
        pool_(cfg_.server.worker_threads) {}

  ~Impl() override;
  Status Init();
  Status Start();
  // The port's credentials: plaintext (--insecure) or TLS from the staged material.
  StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials();
  // auth.token_file: OK when off or when the call carries "authorization: Bearer TOKEN"
  // (compared in constant time); UNAUTHENTICATED otherwise.
  grpc::Status CheckBearer(const grpc::CallbackServerContext* ctx) const;
  Status Run();
  void Stop();

  // --- called by reactors ---
  // `peer`: the CN of the client's certificate (mutual TLS), which becomes its name.
  Status Join(ControlReactor* r, const v1::Join& join, const std::string& peer,
              v1::Welcome* welcome);
  // After the Welcome is queued: the client may now be given tasks.
  void Ready(ControlReactor* r);
  void Heartbeat(ControlReactor* r);
  void Ack(ControlReactor* r, const v1::TaskAck& ack);
  void ControlDone(ControlReactor* r);
  // Checks an upload header; on success returns the exact expected payload size.
  StatusOr<int64_t> CheckUploadHeader(const v1::UploadHeader& h, const std::string& peer,
                                      bool* duplicate);
  // Validates and aggregates a complete upload (runs on the worker pool).
  Status ProcessUpload(const v1::UploadHeader& h, const std::string& payload, bool* duplicate);
  // Payload buffers, reused by the uploads of a round (at most server.worker_threads are
  // held at once): a fresh multi-MiB buffer per upload costs its page faults and zeroing,
  // about a sixth of the server's CPU with 100 clients. Emptied when a round closes
  // (before the next model is built) and when the run ends.
  std::string TakeBuffer(int64_t size);
  void ReturnBuffer(std::string buffer);
  void DropBuffers();
  // The blob a Fetch asks for, and what its fp32 encoding would take.
  StatusOr<std::shared_ptr<const std::string>> FindBlob(const v1::FetchRequest& req,
                                                        const std::string& peer,
                                                        int64_t* fp32_size);
  // Transport bytes (WireSize) of the round, and what compression saved against fp32.
  void CountDown(int64_t n) {
    bytes_down_ += n;
    lifetime_down_ += n;
  }
  void CountUp(int64_t n) {
    bytes_up_ += n;
    lifetime_up_ += n;
  }
  void SavedDown(int64_t n) { saved_down_ += n; }
  void SavedUp(int64_t n) { saved_up_ += n; }
  // UNAUTHENTICATED unless `token` is the session token of connected client `client_id`.
  // With mutual TLS also PERMISSION_DENIED unless `peer` (the call's certificate CN) is
  // the identity the client joined with.
  Status Authenticate(const std::string& client_id, const std::string& token,
                      const std::string& peer);
  // A secure-aggregation stage message of a task of the current round (keys, shares or
  // revealed shares); refused without any change unless it is exactly what the stage
  // expects from that client.
  Status SecAggSubmit(const v1::SecAggRequest& req, const std::string& peer);
  // Split learning.
  Status SetProfile(ControlReactor* r, const v1::Profile& profile);
  // Checks a SplitOpen against the current round's split tasks; one stream per task.
  StatusOr<SplitStreamTask> OpenSplit(const v1::SplitOpen& open, const std::string& peer);
  // A split stream failed (bad message, lost connection): its task fails.
  void SplitEnded(const SplitStreamTask& task, const Status& why);
  void CountSplitUp(int64_t bytes) {
    CountUp(bytes);
    split_up_ += bytes;
  }
  void CountLabels(int64_t labels) { labels_up_ += labels; }
  void CountSplitDown(int64_t bytes) {
    CountDown(bytes);
    split_down_ += bytes;
  }
  int64_t probe_size() const { return kProbeBytes; }
  // The codec name split tensors carry for a compression.* value ("" = float32).
  static std::string SplitCodec(const std::string& spec) {
    return CodecFamily(spec) == "none" ? "" : spec;
  }
  ThreadPool& pool() { return pool_; }
  const Clock& clock() const { return *clock_; }
  void RegisterUpload(std::shared_ptr<UploadReactor> r);
  void UnregisterUpload(UploadReactor* r);
  // `r`, whose header passed, becomes `client_id`'s one upload in progress (an older one
  // still open is cancelled) and asks for an upload slot: true if it may read its
  // payload now; otherwise it is queued and resumed when a slot frees.
  // CancelWaitingUpload removes a queued `r` (true if it was queued). ReleaseUploadSlot
  // is called once by each reactor that held a slot.
  bool ClaimUpload(const std::string& client_id, UploadReactor* r);
  // A refused upload, logged with the sender's identity (names escaped and bounded).
  void LogRefusedUpload(const v1::UploadHeader& h, const Status& why);
  // Cancels every upload still open (called when a round closes).
  void CancelOpenUploads();
  bool CancelWaitingUpload(UploadReactor* r);
  void ReleaseUploadSlot();
  int chunk_bytes() const { return cfg_.server.chunk_bytes; }

  // --- gRPC service ---
  grpc::ServerBidiReactor<v1::ClientMessage, v1::ServerMessage>* Control(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Fetch(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* req) override;
  grpc::ServerReadReactor<v1::UploadChunk>* Upload(grpc::CallbackServerContext* ctx,
                                                   v1::UploadReply* reply) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const v1::StatusRequest* req,
                                      v1::StatusReply* reply) override;
  grpc::ServerBidiReactor<v1::SplitUp, v1::SplitDown>* Split(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerReadReactor<v1::ProbeChunk>* Probe(grpc::CallbackServerContext* ctx,
                                                 v1::ProbeReply* reply) override;
  grpc::ServerUnaryReactor* SecAgg(grpc::CallbackServerContext* ctx, const v1::SecAggRequest* req,
                                   v1::SecAggReply* reply) override;

  ParameterSet GlobalModel() const {
    MutexLock l(&mu_);
    return global_;
  }
  int64_t committed_round() const {
    MutexLock l(&mu_);
    return committed_round_;
  }
  std::vector<RoundMetrics> History() const {
    MutexLock l(&mu_);
    return history_;
  }
  int port() const { return port_; }
  std::string RunId() const {
    MutexLock l(&mu_);
    return run_id_;
  }
  std::pair<int64_t, int64_t> TransportBytes() const { return {lifetime_up_, lifetime_down_}; }
  Server::UploadCounts Uploads() const {
    MutexLock l(&upload_mu_);
    return {static_cast<int>(upload_of_client_.size()), static_cast<int>(upload_waiters_.size())};
  }

 private:
  static constexpr int64_t kProbeBytes = 256 << 10;

  int ConnectedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Connected clients that may be given a task (split, cut: auto: once profiled).
  std::vector<std::string> AvailableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailTaskLocked(const std::string& task_id, TaskRecord& t, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The session of a message about a task of the current round: identity (token), run
  // and round checked; UNAUTHENTICATED or FAILED_PRECONDITION naming `what` otherwise.
  StatusOr<const Session*> CheckSenderLocked(const std::string& what, const std::string& client_id,
                                             const std::string& token, const std::string& peer,
                                             const std::string& run_id, int64_t round) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The session `client_id` with `token`, called from certificate `peer`.
  StatusOr<const Session*> SessionLocked(const std::string& client_id, const std::string& token,
                                         const std::string& peer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The task message for `cid` in `round` (split: publishes its client part); records it.
  v1::ServerMessage MakeTaskLocked(int64_t round, const std::string& cid, const FitSettings& fit,
                                   int64_t deadline_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Split learning: loads the mode, profiles the server's stages, publishes the probe.
  Status InitSplit(const ModelSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool NeedProfile() const { return split_mode_.has_value() && cfg_.split.cut == 0; }
  CutProblem ProblemFor(const Session& s, int clients_in_round) const;
  // Chooses each client's cut and starts the round's SplitRound. Returns the clients
  // that can take part (a client no cut fits is left out).
  StatusOr<std::vector<std::string>> BeginSplitRoundLocked(int64_t round,
                                                           const std::vector<std::string>& clients,
                                                           const FitSettings& fit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Encodes global_ and makes it the model version clients fetch.
  void PublishModelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked(std::shared_ptr<const std::string> blob, std::string digest)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops clients silent past server.client_timeout_s, and cancels uploads that made no
  // progress for server.upload_idle_timeout_s while they could (failing their task, so a
  // stalling client holds an upload slot at most once per round). Releases mu_ while
  // closing streams.
  void ExpireSilentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits on cv_ until `until` or at most kPoll, so that the caller can expire silent
  // clients and stalled uploads meanwhile.
  void WaitLocked(Clock::time_point until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    clock_->WaitUntil(cv_, mu_, std::min(until, clock_->Now() + kPoll));
  }
  void FailTasksOfLocked(const std::string& client_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RoundResolvedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Secure aggregation: starts the round's SecAggRound for `clients`.
  Status BeginSecAggLocked(int64_t round, const std::vector<std::string>& clients)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drives secagg_'s stages until its unmasking closes (OK) or the round cannot go on;
  // masked inputs are due by `training_deadline`, each other stage within
  // secure_aggregation.stage_timeout_s. Releases mu_ while sending.
  Status RunSecAggStagesLocked(Clock::time_point training_deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Unmasks the round's sum and folds it into the strategy as one update weighted by
  // the survivors' `total_examples`.
  Status AccumulateSecAgg(const SecAggRound& round, int64_t total_examples, const ParameterSet& layout);
  // FLTrust: trains `global` on the root data with the round's local settings (as the
  // paper does) and hands the change to the strategy. Runs on the round thread without
  // mu_ (it owns model_ then).
  Status SetFlTrustReference(const ParameterSet& global, const FitSettings& fit);
  // Distributed DP and aggregation.weighting: equal: every masked update counts the same.
  bool UniformSecAggWeights() const {
    return (cfg_.dp.enabled && cfg_.dp.noise == "distributed") ||
           cfg_.aggregation.weighting == "equal";
  }
  // Runs the next round to its aggregate and publishes the new model (Commit then
  // evaluates and persists it). `evaluate_only`: instead, the connected clients measure
  // the last committed model on their held-out data (the final evaluation); nothing is
  // aggregated and the model stays.
  StatusOr<RoundMetrics> RunRound(bool evaluate_only = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status Commit(RoundMetrics* m);
  // After the last round: the final model's federated evaluation, when clients hold
  // data out (server.final_evaluation). Appended to metrics.jsonl; never fails the run.
  void FinalEvaluation(double elapsed_s);
  Status LoadCheckpoint() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The serialized checkpoint of the last committed round.
  std::string CheckpointLocked(double elapsed_s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps only the metrics.jsonl lines of rounds <= committed_round_, and notes from them
  // whether clients evaluate and which round's model had its final evaluation.
  Status TrimMetrics() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells every client the run ended (RunEnded): they exit.
  void EndRun(const std::string& reason);
  // Closes every control stream with UNAVAILABLE: clients reconnect (server stopped).
  void DisconnectClients();
  // TLS: copies checked material into tls_dir_ (a new version directory behind the
  // symlink tls_dir_/current, so that gRPC's file watcher reads key and certificate as
  // one consistent pair).
  Status StageTls(const TlsMaterial& m);
  // Every tls.reload_s: re-checks the TLS files (a bad one is logged and the current
  // material kept) and re-reads tls.revoked, ending the sessions of revoked identities.
  void ReloadTlsLoop();
  void ApplyRevocations(std::set<std::string> revoked);
  std::string Path(const std::string& name) const {
    return (std::filesystem::path(opts_.run_dir) / name).string();
  }

  const ServerOptions opts_;
  const JobConfig& cfg_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int port_ = 0;

  std::unique_ptr<Model> model_;  // evaluation only (Run thread)
  Dataset test_;
  std::unique_ptr<Strategy> strategy_;
  v1::ModelDescription model_desc_;
  ModelSpec model_spec_;
  std::unique_ptr<Codec> update_codec_;  // compression.update, unless none (decoding only)
  // compression.broadcast, unless none; used by one thread at a time (start, round end).
  std::unique_ptr<Codec> broadcast_codec_;
  // The blob a model (or client part) is sent down as: fp32, or compression.broadcast.
  std::string ModelBlob(const ParameterSet& model) {
    return broadcast_codec_ ? EncodeCompressedSet(*broadcast_codec_, model) : model.Encode();
  }

  // Split learning (split.mode set); fixed after Init.
  std::optional<SplitMode> split_mode_;
  int num_stages_ = 0;
  int tail_begin_ = 0;
  int num_classes_ = 10;
  std::vector<StageProfile> server_profile_;
  std::vector<std::vector<int64_t>> stage_shapes_;  // per-sample input of stage s, s <= n
  // The current split round's client part at each cut and its published blob.
  struct PartBlob {
    std::shared_ptr<const ParameterSet> part;
    std::string digest;
    int64_t size = 0;
  };
  std::map<int, PartBlob> part_blobs_ ABSL_GUARDED_BY(mu_);
  // LoRA: each cut's frozen tensors (digest, size of the pinned blob), all run long.
  std::map<int, std::pair<std::string, int64_t>> cut_bases_ ABSL_GUARDED_BY(mu_);
  CutProblem model_problem_;  // the cost model's model- and server-side inputs
  std::string probe_digest_;

  // Time for every deadline and timeout (ServerOptions::clock; the real one by default).
  const std::shared_ptr<Clock> clock_;
  // How often waits wake to expire silent clients and stalled uploads.
  static constexpr Clock::duration kPoll = std::chrono::milliseconds(200);

  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string run_id_ ABSL_GUARDED_BY(mu_);
  std::string bearer_;  // "Bearer TOKEN" from auth.token_file; empty = no token check
  std::unique_ptr<RunFiles> run_files_;  // metrics.jsonl and checkpoint.pb (with a run dir)
  // server.max_sessions, or derived from the descriptor limit
  int max_sessions_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> revoked_ ABSL_GUARDED_BY(mu_);  // tls.revoked: identities refused at once
  // TLS staging (see StageTls); owned by Start and then the reload thread.
  std::string tls_dir_;
  int tls_version_ = 0;
  TlsMaterial tls_material_;
  std::thread tls_thread_;
  // The current round's secure aggregation (secure_aggregation.enabled), else null.
  std::unique_ptr<SecAggRound> secagg_ ABSL_GUARDED_BY(mu_);
  int round_clients_ ABSL_GUARDED_BY(mu_) = 0;  // clients sampled for the current round
  bool evaluating_ ABSL_GUARDED_BY(mu_) = false;  // the current round is evaluation only
  // some client has reported a federated evaluation
  bool clients_evaluate_ ABSL_GUARDED_BY(mu_) = false;
  // the round whose model had its final evaluation
  int64_t final_evaluated_round_ ABSL_GUARDED_BY(mu_) = 0;
  // the current round's bound on declared example counts
  RoundWeights round_weights_ ABSL_GUARDED_BY(mu_);
  Dataset root_;           // aggregation.root_data (fltrust); empty otherwise
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);            // client sampling (checkpointed)
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<const std::string>> blobs_ ABSL_GUARDED_BY(mu_);
  // The fp32 encoding size of model and part blobs (by digest), for compression ratios.
  std::map<std::string, int64_t> fp32_sizes_ ABSL_GUARDED_BY(mu_);
  ParameterSet global_ ABSL_GUARDED_BY(mu_);
  // model.personal's tensors: they stay on the devices. global_ keeps their initial
  // values (clients start from them).
  std::vector<std::string> personal_;
  // The frozen tensors (a LoRA model's base): never trained, so never in an update nor
  // in the model blob of a round; clients fetch them once, as the pinned base blob.
  // Checkpoints hold the rest: the base follows from the config (seed, model.weights).
  std::vector<std::string> frozen_;
  std::string base_digest_;
  int64_t base_size_ = 0;
  // What updates leave out: personal_ and frozen_. Updates, the strategy and secure
  // aggregation see shared_layout_ (global_ without them).
  std::vector<std::string> not_updated_;
  ParameterSet shared_layout_;  // its values are not kept up to date: a layout only
  // The layout of an update (and of the strategy's sums).
  const ParameterSet& UpdateLayout() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return not_updated_.empty() ? global_ : shared_layout_;
  }
  // What a round's model blob and a checkpoint hold: the model without its frozen base;
  // `model` itself (no copy) when nothing is frozen, else that part of it in `scratch`.
  const ParameterSet& Published(const ParameterSet& model, ParameterSet& scratch) const {
    if (frozen_.empty()) return model;
    scratch = Without(model, frozen_);
    return scratch;
  }
  // The Run thread is the only writer of global_ (under mu_), so it may read it without.
  const ParameterSet& RunThreadGlobal() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return global_; }
  std::string model_digest_ ABSL_GUARDED_BY(mu_);
  std::string loss_digest_;  // the TorchScript loss's blob (train.loss: torchscript)
  int64_t loss_size_ = 0;
  int64_t committed_round_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t current_round_ ABSL_GUARDED_BY(mu_) = 0;  // round in progress; 0 when none
  std::map<std::string, TaskRecord> tasks_ ABSL_GUARDED_BY(mu_);  // tasks of the current round
  // sl: clients still to take their turn
  std::deque<std::string> turns_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<SplitRound> split_round_ ABSL_GUARDED_BY(mu_);  // the current split round
  // kept across rounds (TorchScript, probe)
  std::set<std::string> pinned_blobs_ ABSL_GUARDED_BY(mu_);
  std::vector<RoundMetrics> history_ ABSL_GUARDED_BY(mu_);
  int64_t next_client_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t total_bytes_up_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t total_bytes_down_ ABSL_GUARDED_BY(mu_) = 0;
  double prior_elapsed_s_ = 0;  // wall time of the run before a resume
  std::atomic<int64_t> bytes_up_{0}, bytes_down_{0};
  std::atomic<int64_t> split_up_{0}, split_down_{0}, labels_up_{0};
  std::atomic<int64_t> saved_up_{0}, saved_down_{0};
  std::atomic<int64_t> update_bytes_{0};  // payloads of accepted uploads this round
  Mutex buffers_mu_;  // after mu_ and upload_mu_ when taken with them
  std::vector<std::string> buffers_ ABSL_GUARDED_BY(buffers_mu_);
  std::atomic<int64_t> lifetime_up_{0}, lifetime_down_{0};
  std::string phase_ ABSL_GUARDED_BY(mu_) = "starting";
  double last_accuracy_ ABSL_GUARDED_BY(mu_) = 0;

  mutable Mutex upload_mu_;
  int upload_slots_free_ ABSL_GUARDED_BY(upload_mu_);
  std::deque<UploadReactor*> upload_waiters_ ABSL_GUARDED_BY(upload_mu_);
  std::map<UploadReactor*, std::shared_ptr<UploadReactor>> open_uploads_
      ABSL_GUARDED_BY(upload_mu_);
  // see ClaimUpload
  std::map<std::string, UploadReactor*> upload_of_client_ ABSL_GUARDED_BY(upload_mu_);

  ThreadPool pool_;  // last member: its workers finish before the state above dies
};

namespace {

// ---------------------------------------------------------------------------------
// A bidirectional stream whose writes are queued: one write in flight at a time.
// Owned by shared_ptr (the server may hold one) so that Send/Close may be called after
// the stream ended; no gRPC operation is ever started while one of our mutexes is held,
// since gRPC may run the resulting reaction inline.
template <class In, class Out>
class QueuedBidiReactor : public grpc::ServerBidiReactor<In, Out> {
 public:
  // Queues a message. Returns false if the stream is finishing.
  bool Send(Out msg, bool finish_after = false) {
    const Out* start = nullptr;
    {
      MutexLock l(&wmu_);
      if (finishing_) return false;
      Queued(msg);
      out_.push_back(std::move(msg));
      if (finish_after) finish_after_writes_ = true;
      // Only OnWriteDone pops, and not before this write completes: the element stays.
      if (!writing_) start = &out_.front();
      writing_ = true;
    }
    if (start != nullptr) this->StartWrite(start);
    return true;
  }

  // Ends the stream with `s` once the messages already queued are written.
  void Close(const grpc::Status& s) {
    bool now = false;
    {
      MutexLock l(&wmu_);
      now = FinishLocked(s);
    }
    if (now) this->Finish(s);
  }

  void OnWriteDone(bool ok) override {
    const Out* next = nullptr;
    bool finish = false;
    grpc::Status status;
    {
      MutexLock l(&wmu_);
      out_.pop_front();
      if (!ok) {
        out_.clear();
        writing_ = false;
        status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed");
        finish = FinishLocked(status);
      } else if (!out_.empty()) {  // also when finishing: what was queued goes first
        next = &out_.front();
      } else {
        writing_ = false;
        if (finish_after_writes_ || finishing_) {
          status = finishing_ ? pending_status_ : grpc::Status::OK;
          finish = FinishLocked(status);
        }
      }
    }
    if (next != nullptr) this->StartWrite(next);
    if (finish) this->Finish(status);
  }

 private:
  // Returns true when the caller must call Finish(s) now (after releasing wmu_).
  bool FinishLocked(const grpc::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(wmu_) {
    if (finished_) return false;
    if (!finishing_) pending_status_ = s;
    finishing_ = true;
    if (writing_) return false;  // OnWriteDone finishes
    finished_ = true;
    return true;
  }

  // Called for each message queued (with wmu_ held): to count it.
  virtual void Queued(const Out& msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(wmu_) = 0;

  Mutex wmu_;
  std::deque<Out> out_ ABSL_GUARDED_BY(wmu_);
  bool writing_ ABSL_GUARDED_BY(wmu_) = false;
  bool finishing_ ABSL_GUARDED_BY(wmu_) = false;
  bool finished_ ABSL_GUARDED_BY(wmu_) = false;
  bool finish_after_writes_ ABSL_GUARDED_BY(wmu_) = false;
  grpc::Status pending_status_ ABSL_GUARDED_BY(wmu_);
};

// ---------------------------------------------------------------------------------
// Control stream: one per client.
class ControlReactor : public QueuedBidiReactor<v1::ClientMessage, v1::ServerMessage> {
 public:
  static ControlReactor* Create(Server::Impl* impl, std::string peer) {
    auto r = std::shared_ptr<ControlReactor>(new ControlReactor(impl, std::move(peer)));
    r->self_ = r;
    impl->CountUp(kCallBytesUp);
    impl->CountDown(kCallBytesDown);
    r->StartRead(&r->in_);
    return r.get();
  }

  std::shared_ptr<ControlReactor> shared() { return self_; }
  const std::string& client_id() const { return client_id_; }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // A client closes its control stream by cancelling it (then this status goes
      // nowhere); a read also fails on bytes that do not decode as a ClientMessage.
      Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                         "control stream: a message did not decode, or the client half-closed "
                         "the stream (it must stay open while the client takes part)"));
      return;
    }
    impl_->CountUp(WireSize(in_));
    if (client_id_.empty()) {
      if (in_.kind_case() != v1::ClientMessage::kJoin) {
        Close(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                           "the first message on the control stream must be Join"));
        return;
      }
      impl_->CountUp(kConnectionBytesUp);
      v1::Welcome welcome;
      Status s = impl_->Join(this, in_.join(), peer_, &welcome);
      if (!s.ok()) {
        Close(ToGrpc(s));
        return;
      }
      client_id_ = welcome.client_id();
      v1::ServerMessage msg;
      *msg.mutable_welcome() = welcome;
      Send(std::move(msg));
      impl_->Ready(this);
    } else {
      switch (in_.kind_case()) {
        case v1::ClientMessage::kHeartbeat:
          impl_->Heartbeat(this);
          break;
        case v1::ClientMessage::kAck:
          impl_->Heartbeat(this);
          impl_->Ack(this, in_.ack());
          break;
        case v1::ClientMessage::kProfile:
          if (Status s = impl_->SetProfile(this, in_.profile()); !s.ok()) {
            Close(ToGrpc(s));
            return;
          }
          break;
        default:
          Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             "unexpected message on the control stream after Join"));
          return;
      }
    }
    StartRead(&in_);
  }

  void OnDone() override {
    impl_->ControlDone(this);
    self_.reset();  // may delete this
  }

 private:
  ControlReactor(Server::Impl* impl, std::string peer) : impl_(impl), peer_(std::move(peer)) {}
  void Queued(const v1::ServerMessage& msg) override { impl_->CountDown(WireSize(msg)); }

  Server::Impl* impl_;
  std::shared_ptr<ControlReactor> self_;
  v1::ClientMessage in_;
  const std::string peer_;  // the client certificate's CN (mutual TLS)
  std::string client_id_;  // set after Join; read only by reactions
};

// ---------------------------------------------------------------------------------
// Blob download: one chunk written at a time, each a v1::Chunk encoded by hand so that
// its data is a slice of the blob itself (held by a reference to the blob, released
// when gRPC is done with the slice): a download in flight costs gRPC's own per-stream
// state (about 20 KB measured, bench_server_memory --fetchers), whatever
// server.chunk_bytes is, and every client's download shares the one copy.
class FetchReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(Server::Impl* impl, const v1::FetchRequest& req, const std::string& peer)
      : impl_(impl) {
    impl_->CountUp(kCallBytesUp + WireSize(req));
    impl_->CountDown(kCallBytesDown);
    auto blob = impl_->FindBlob(req, peer, &fp32_size_);
    if (!blob.ok()) {
      Finish(ToGrpc(blob.status()));
      return;
    }
    blob_ = *std::move(blob);
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "download interrupted"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    const int64_t total = static_cast<int64_t>(blob_->size());
    if (offset_ >= total) {
      impl_->SavedDown(fp32_size_ - total);
      Finish(grpc::Status::OK);
      return;
    }
    const int64_t n = std::min<int64_t>(impl_->chunk_bytes(), total - offset_);
    // Chunk's offset and total_size, then its data field's tag and length, then the data.
    v1::Chunk head;
    head.set_offset(offset_);
    head.set_total_size(total);
    std::string prefix = head.SerializeAsString();
    google::protobuf::io::StringOutputStream out(&prefix);
    {
      google::protobuf::io::CodedOutputStream coded(&out);
      coded.WriteTag(v1::Chunk::kDataFieldNumber << 3 | 2);  // wire type 2: length-delimited
      coded.WriteVarint64(static_cast<uint64_t>(n));
    }
    auto* owner = new std::shared_ptr<const std::string>(blob_);
    grpc::Slice slices[2] = {
        grpc::Slice(prefix),
        grpc::Slice(const_cast<char*>(blob_->data() + offset_), static_cast<size_t>(n),
                    [](void* p) { delete static_cast<std::shared_ptr<const std::string>*>(p); },
                    owner)};
    chunk_ = grpc::ByteBuffer(slices, 2);
    offset_ += n;
    impl_->CountDown(WireSize(static_cast<int64_t>(prefix.size()) + n));
    StartWrite(&chunk_);
  }

  Server::Impl* impl_;
  std::shared_ptr<const std::string> blob_;
  int64_t fp32_size_ = 0;  // what the blob would be as fp32
  int64_t offset_ = 0;
  grpc::ByteBuffer chunk_;
};

// ---------------------------------------------------------------------------------
// Update upload: header first, then data; validated and aggregated on the worker pool.
// Registered with the server while open, so that closing a round can cancel uploads
// that stall (a client that sends a header and then nothing would otherwise hold an
// upload slot for as long as its connection lives).
class UploadReactor : public grpc::ServerReadReactor<v1::UploadChunk> {
 public:
  static UploadReactor* Create(Server::Impl* impl, grpc::CallbackServerContext* ctx,
                               v1::UploadReply* reply) {
    auto r = std::shared_ptr<UploadReactor>(new UploadReactor(impl, ctx, reply));
    r->self_ = r;
    impl->CountUp(kCallBytesUp);
    impl->CountDown(kCallBytesDown);
    impl->RegisterUpload(r);
    r->StartRead(&r->in_);
    return r.get();
  }

  // Cancels the call if it is still receiving data; one that has all its data finishes
  // on its own once validated. Any thread.
  void Cancel() {
    MutexLock l(&done_mu_);
    if (!done_ && !received_all_) ctx_->TryCancel();
  }

  // True, once, when the call has waited for its client longer than `limit` (the time
  // it spends queued for an upload slot does not count). Any thread.
  bool ExpireIfIdle(Clock::duration limit, Clock::time_point now) {
    if (queued_.load() || received_all_flag_.load()) return false;
    if (now - Clock::time_point(Clock::duration(last_progress_.load())) <= limit) return false;
    return !expired_.exchange(true);
  }
  const v1::UploadHeader* header() const { return have_header_flag_.load() ? &header_ : nullptr; }

  void OnReadDone(bool ok) override {
    Touch();
    if (!ok) {  // client finished writing
      if (!have_header_) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "upload without a header"));
        return;
      }
      if (static_cast<int64_t>(payload_.size()) != expected_) {
        Finish(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("upload ended after ", payload_.size(), " of ", expected_, " bytes")));
        return;
      }
      {
        MutexLock l(&done_mu_);
        received_all_ = true;
      }
      received_all_flag_ = true;
      impl_->pool().Submit([this] {
        bool duplicate = false;
        Status s = impl_->ProcessUpload(header_, payload_, &duplicate);
        impl_->ReturnBuffer(std::move(payload_));
        if (!s.ok()) impl_->LogRefusedUpload(header_, s);
        reply_->set_duplicate(duplicate);
        Finish(ToGrpc(s));
      });
      return;
    }
    impl_->CountUp(WireSize(in_));
    if (!have_header_) {
      if (in_.kind_case() != v1::UploadChunk::kHeader) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            "the first upload message must be the header"));
        return;
      }
      header_ = in_.header();
      // protocol.md: codec "none" is fp32.
      if (header_.codec() == "none") header_.set_codec("fp32");
      bool duplicate = false;
      auto expected = impl_->CheckUploadHeader(header_, peer_, &duplicate);
      if (!expected.ok()) {
        impl_->LogRefusedUpload(header_, expected.status());
        Finish(ToGrpc(expected.status()));
        return;
      }
      if (duplicate) {  // already counted: acknowledge without reading the payload
        reply_->set_duplicate(true);
        Finish(grpc::Status::OK);
        return;
      }
      expected_ = *expected;
      have_header_ = true;
      have_header_flag_ = true;
      // Hold at most server.worker_threads payloads in memory at once: without a slot,
      // stop reading and let HTTP/2 flow control hold the client back until Resume().
      if (!impl_->ClaimUpload(header_.client_id(), this)) return;
      payload_ = impl_->TakeBuffer(expected_);
    } else {
      if (in_.kind_case() != v1::UploadChunk::kData) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a second upload header"));
        return;
      }
      const std::string& d = in_.data();
      if (static_cast<int64_t>(payload_.size() + d.size()) > expected_) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("upload is larger than the announced ", expected_,
                                         " bytes")));
        return;
      }
      payload_.append(d);
    }
    StartRead(&in_);
  }

  // Called by the server (under its upload mutex) when this upload queues for a slot,
  // and when it gets one: the time it waits queued is not idle time.
  void Queue() { queued_ = true; }
  void Granted() {
    Touch();
    queued_ = false;
  }
  // Called by the server when this waiting upload got its slot.
  void Resume() {
    payload_ = impl_->TakeBuffer(expected_);
    StartRead(&in_);
  }

  void OnCancel() override {
    if (impl_->CancelWaitingUpload(this)) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "upload cancelled while queued"));
    }
  }

  void OnDone() override {
    {
      MutexLock l(&done_mu_);
      done_ = true;
    }
    impl_->UnregisterUpload(this);
    if (has_slot) impl_->ReleaseUploadSlot();
    self_.reset();  // may delete this
  }

  bool has_slot = false;  // written by the server under its upload mutex

 private:
  UploadReactor(Server::Impl* impl, grpc::CallbackServerContext* ctx, v1::UploadReply* reply)
      : impl_(impl), ctx_(ctx), peer_(PeerIdentity(ctx)), reply_(reply) {
    Touch();
  }

  void Touch() { last_progress_ = impl_->clock().Now().time_since_epoch().count(); }

  Server::Impl* impl_;
  grpc::CallbackServerContext* ctx_;
  const std::string peer_;
  std::shared_ptr<UploadReactor> self_;
  Mutex done_mu_;
  bool done_ ABSL_GUARDED_BY(done_mu_) = false;
  bool received_all_ ABSL_GUARDED_BY(done_mu_) = false;
  v1::UploadReply* reply_;
  v1::UploadChunk in_;
  v1::UploadHeader header_;
  bool have_header_ = false;
  int64_t expected_ = 0;
  std::string payload_;
  // Read by the server's expiry check from another thread, which holds upload_mu_: it
  // must not take done_mu_ (Cancel holds done_mu_ while TryCancel may run OnCancel, which
  // takes upload_mu_), hence atomics beside the fields done_mu_ guards.
  std::atomic<Clock::duration::rep> last_progress_{0};  // when the client last sent something
  std::atomic<bool> queued_{false};           // waiting for an upload slot
  std::atomic<bool> received_all_flag_{false};
  std::atomic<bool> have_header_flag_{false};  // header_ is set and stays unchanged
  std::atomic<bool> expired_{false};
};

// ---------------------------------------------------------------------------------
// Split stream: one per split task. Messages are processed in order on the worker pool,
// one at a time per stream, never inside a reaction; reading pauses while `window`+1
// messages wait, so a client cannot queue unbounded work.
class SplitReactor : public QueuedBidiReactor<v1::SplitUp, v1::SplitDown> {
 public:
  static SplitReactor* Create(Server::Impl* impl, std::string peer) {
    auto r = std::shared_ptr<SplitReactor>(new SplitReactor(impl, std::move(peer)));
    r->self_ = r;
    impl->CountSplitUp(kCallBytesUp);
    impl->CountSplitDown(kCallBytesDown);
    r->StartRead(&r->in_);
    return r.get();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client finished sending (or the call is gone)
      bool close_now = false;
      {
        MutexLock l(&mu_);
        read_done_ = true;
        close_now = !busy_ && !failed_;
      }
      if (!opened_) {
        Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "split stream without SplitOpen"));
      } else if (close_now) {
        Close(grpc::Status::OK);
      }
      return;
    }
    impl_->CountSplitUp(WireSize(in_));
    if (!opened_) {
      if (in_.kind_case() != v1::SplitUp::kOpen) {
        Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                           "the first split message must be SplitOpen"));
        return;
      }
      auto task = impl_->OpenSplit(in_.open(), peer_);
      if (!task.ok()) {
        Close(ToGrpc(task.status()));
        return;
      }
      act_codec_ = MakeStatelessCodec(task->act_codec, 1).value();  // checked at start
      grad_codec_ = MakeStatelessCodec(task->grad_codec, 2).value();
      assembler_.emplace(static_cast<size_t>(4 * task->max_elements));
      {
        MutexLock l(&mu_);  // OnCancel may read them on another thread
        task_ = *std::move(task);
        opened_ = true;
      }
      v1::SplitDown ready;
      ready.mutable_ready();
      Send(std::move(ready));
      StartRead(&in_);
      return;
    }
    bool schedule = false, read_more = false;
    {
      MutexLock l(&mu_);
      inbox_.push_back(std::move(in_));
      ++outstanding_;
      schedule = !busy_ && !failed_;
      if (schedule) busy_ = true;
      read_more = !failed_ && outstanding_ <= task_.window;
      paused_ = !read_more;
    }
    if (schedule) {
      auto self = self_;
      impl_->pool().Submit([self] { self->Drain(); });
    }
    if (read_more) StartRead(&in_);
  }

  void OnCancel() override {
    SplitStreamTask task;
    {
      MutexLock l(&mu_);
      if (!opened_) return;
      task = task_;
    }
    impl_->SplitEnded(task, absl::CancelledError("split stream lost"));
  }

  void OnDone() override { self_.reset(); }  // may delete this

 private:
  SplitReactor(Server::Impl* impl, std::string peer) : impl_(impl), peer_(std::move(peer)) {}
  void Queued(const v1::SplitDown& msg) override { impl_->CountSplitDown(WireSize(msg)); }

  // Runs on the pool: processes queued messages until none is left.
  void Drain() {
    while (true) {
      v1::SplitUp msg;
      bool close = false;
      {
        MutexLock l(&mu_);
        if (inbox_.empty()) {
          busy_ = false;
          close = read_done_;
          if (!close) return;
        } else {
          msg = std::move(inbox_.front());
          inbox_.pop_front();
        }
      }
      if (close) {
        Close(grpc::Status::OK);
        return;
      }
      Status s = Process(std::move(msg));
      bool resume = false;
      {
        MutexLock l(&mu_);
        --outstanding_;
        if (!s.ok()) failed_ = true;
        if (s.ok() && paused_ && outstanding_ <= task_.window) {
          paused_ = false;
          resume = true;
        }
      }
      if (!s.ok()) {
        impl_->SplitEnded(task_, s);
        Close(ToGrpc(s));
        return;
      }
      if (resume) StartRead(&in_);
    }
  }

  // A message of the stream: a whole one is processed; a tensor in chunks waits for
  // its last chunk.
  Status Process(v1::SplitUp in) {
    ASSIGN_OR_RETURN(std::optional<v1::SplitUp> whole, assembler_->Add(std::move(in)));
    if (!whole) return absl::OkStatus();
    const v1::SplitUp& msg = *whole;
    SplitRound& round = *task_.round;
    const auto t0 = std::chrono::steady_clock::now();  // compute time, not a deadline
    auto seconds = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    v1::SplitDown out;
    if (msg.kind_case() == v1::SplitUp::kBatch) {
      const v1::SplitBatch& b = msg.batch();
      if (b.seq() != next_seq_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "micro-batch ", b.seq(), " arrived, expected ", next_seq_, " (replayed or out of order)"));
      }
      ASSIGN_OR_RETURN(Activations act,
                       FromWire(b.activations(), task_.act_codec, act_codec_.get()));
      RETURN_IF_ERROR(round.CheckActivations(task_.client_id, act));
      std::vector<int64_t> labels(b.labels().begin(), b.labels().end());
      RETURN_IF_ERROR(round.CheckLabels(act, labels));
      impl_->CountLabels(static_cast<int64_t>(labels.size()));
      ++next_seq_;
      if (round.options().mode == SplitMode::kUShaped) {
        ASSIGN_OR_RETURN(Activations mid, round.ForwardMiddle(task_.client_id, b.seq(), act));
        pending_.insert(b.seq());
        auto* f = out.mutable_forward();
        f->set_seq(b.seq());
        ToWire(mid, task_.act_codec, act_codec_.get(), f->mutable_activations());
        f->set_server_seconds(seconds());
      } else {
        ASSIGN_OR_RETURN(ModelPart::LossStep step,
                         round.TrainStep(task_.client_id, act, labels));
        auto* r = out.mutable_result();
        r->set_seq(b.seq());
        ToWire(step.grad_in, task_.grad_codec, grad_codec_.get(), r->mutable_grad());
        r->set_loss(step.loss);
        r->set_server_seconds(seconds());
      }
    } else if (msg.kind_case() == v1::SplitUp::kGrad) {
      const v1::SplitGrad& g = msg.grad();
      if (round.options().mode != SplitMode::kUShaped) {
        return absl::InvalidArgumentError("SplitGrad is only sent in U-shaped split learning");
      }
      if (!pending_.count(g.seq())) {
        return absl::InvalidArgumentError(
            absl::StrCat("gradient for micro-batch ", g.seq(), ", which is not pending"));
      }
      ASSIGN_OR_RETURN(Activations grad, FromWire(g.grad(), task_.grad_codec, grad_codec_.get()));
      ASSIGN_OR_RETURN(Activations gin, round.BackwardMiddle(task_.client_id, g.seq(), grad));
      pending_.erase(g.seq());
      auto* r = out.mutable_result();
      r->set_seq(g.seq());
      ToWire(gin, task_.grad_codec, grad_codec_.get(), r->mutable_grad());
      r->set_server_seconds(seconds());
    } else {
      return absl::InvalidArgumentError("unexpected message on a split stream");
    }
    for (auto& m : Chunked(std::move(out))) Send(std::move(m));
    return absl::OkStatus();
  }

  // `spec` is the codec the task set for this kind of tensor ("" = float32).
  StatusOr<Activations> FromWire(const v1::TensorData& t, const std::string& spec,
                                 const Codec* codec) const {
    if (t.codec() != spec) {
      return absl::InvalidArgumentError(absl::StrCat("tensor encoded as '", t.codec(),
                                                     "', the task set '", spec, "'"));
    }
    int64_t n = 1;
    for (int64_t d : t.shape()) {
      if (d <= 0 || n > task_.max_elements / d) {
        return absl::InvalidArgumentError("tensor shape has a non-positive or oversized dimension");
      }
      n *= d;
    }
    if (t.shape().empty()) return absl::InvalidArgumentError("tensor without a shape");
    Activations a;
    a.shape.assign(t.shape().begin(), t.shape().end());
    auto values = DecodeValues(codec, t.data(), a.shape);
    if (!values.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor data does not match its shape: ", values.status().message()));
    }
    a.values = *std::move(values);
    impl_->SavedUp(4 * n - static_cast<int64_t>(t.data().size()));
    return a;
  }

  void ToWire(const Activations& a, const std::string& spec, Codec* codec,
              v1::TensorData* t) const {
    for (int64_t d : a.shape) t->add_shape(d);
    t->set_codec(spec);
    t->set_data(EncodeValues(codec, a.values, a.shape));
    impl_->SavedDown(4 * static_cast<int64_t>(a.values.size()) - static_cast<int64_t>(t->data().size()));
  }

  Server::Impl* impl_;
  const std::string peer_;
  std::shared_ptr<SplitReactor> self_;
  v1::SplitUp in_;
  bool opened_ = false;   // written under mu_ once, by a reaction
  SplitStreamTask task_;  // fixed when opened_ is set
  // Pool-side state (one Drain at a time).
  int64_t next_seq_ = 1;
  std::set<int64_t> pending_;
  std::unique_ptr<Codec> act_codec_, grad_codec_;  // this stream's (stochastic rounding)
  std::optional<ChunkAssembler<v1::SplitUp>> assembler_;  // set when opened
  Mutex mu_;
  std::deque<v1::SplitUp> inbox_ ABSL_GUARDED_BY(mu_);
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

// ---------------------------------------------------------------------------------
// Uplink probe: counts and discards what the client sends.
class ProbeReactor : public grpc::ServerReadReactor<v1::ProbeChunk> {
 public:
  ProbeReactor(Server::Impl* impl, v1::ProbeReply* reply, std::string peer)
      : impl_(impl), reply_(reply), peer_(std::move(peer)) {
    impl_->CountUp(kCallBytesUp);
    impl_->CountDown(kCallBytesDown);
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      reply_->set_bytes(bytes_);
      impl_->CountDown(WireSize(*reply_));
      Finish(grpc::Status::OK);
      return;
    }
    impl_->CountUp(WireSize(in_));
    if (bytes_ == 0 && !authenticated_) {
      if (Status s = impl_->Authenticate(in_.client_id(), in_.session_token(), peer_); !s.ok()) {
        Finish(ToGrpc(s));
        return;
      }
      authenticated_ = true;
    }
    bytes_ += static_cast<int64_t>(in_.data().size());
    if (bytes_ > impl_->probe_size()) {
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "probe larger than probe_size"));
      return;
    }
    StartRead(&in_);
  }

  void OnDone() override { delete this; }

 private:
  Server::Impl* impl_;
  v1::ProbeReply* reply_;
  const std::string peer_;
  v1::ProbeChunk in_;
  int64_t bytes_ = 0;
  bool authenticated_ = false;
};

}  // namespace

// ---------------------------------------------------------------------------------
// Service entry points.

grpc::Status Server::Impl::CheckBearer(const grpc::CallbackServerContext* ctx) const {
  if (bearer_.empty()) return grpc::Status::OK;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no bearer token (auth.token_file)");
  }
  if (!TokenMatches(bearer_, std::string(it->second.data(), it->second.size()))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
  }
  return grpc::Status::OK;
}

grpc::ServerBidiReactor<v1::ClientMessage, v1::ServerMessage>* Server::Impl::Control(
    grpc::CallbackServerContext* ctx) {
  using R = grpc::ServerBidiReactor<v1::ClientMessage, v1::ServerMessage>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  return ControlReactor::Create(this, PeerIdentity(ctx));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* Server::Impl::Fetch(grpc::CallbackServerContext* ctx,
                                                                 const grpc::ByteBuffer* req) {
  using R = grpc::ServerWriteReactor<grpc::ByteBuffer>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  v1::FetchRequest request;
  grpc::ByteBuffer bytes(*req);  // Deserialize takes a mutable buffer: a reference copy
  if (!grpc::SerializationTraits<v1::FetchRequest>::Deserialize(&bytes, &request).ok()) {
    return new Refusal<R>(ToGrpc(absl::InvalidArgumentError("malformed FetchRequest")));
  }
  return new FetchReactor(this, request, PeerIdentity(ctx));
}

grpc::ServerReadReactor<v1::UploadChunk>* Server::Impl::Upload(grpc::CallbackServerContext* ctx,
                                                               v1::UploadReply* reply) {
  using R = grpc::ServerReadReactor<v1::UploadChunk>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  return UploadReactor::Create(this, ctx, reply);
}

grpc::ServerBidiReactor<v1::SplitUp, v1::SplitDown>* Server::Impl::Split(
    grpc::CallbackServerContext* ctx) {
  using R = grpc::ServerBidiReactor<v1::SplitUp, v1::SplitDown>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  return SplitReactor::Create(this, PeerIdentity(ctx));
}

grpc::ServerReadReactor<v1::ProbeChunk>* Server::Impl::Probe(grpc::CallbackServerContext* ctx,
                                                             v1::ProbeReply* reply) {
  using R = grpc::ServerReadReactor<v1::ProbeChunk>;
  if (auto s = CheckBearer(ctx); !s.ok()) return new Refusal<R>(s);
  return new ProbeReactor(this, reply, PeerIdentity(ctx));
}

grpc::ServerUnaryReactor* Server::Impl::SecAgg(grpc::CallbackServerContext* ctx,
                                               const v1::SecAggRequest* req,
                                               v1::SecAggReply* reply) {
  auto* r = ctx->DefaultReactor();
  if (auto s = CheckBearer(ctx); !s.ok()) {
    r->Finish(s);
    return r;
  }
  CountUp(kCallBytesUp + WireSize(*req));
  CountDown(kCallBytesDown + WireSize(*reply));
  r->Finish(ToGrpc(SecAggSubmit(*req, PeerIdentity(ctx))));
  return r;
}

grpc::ServerUnaryReactor* Server::Impl::GetStatus(grpc::CallbackServerContext* ctx,
                                                  const v1::StatusRequest* req,
                                                  v1::StatusReply* reply) {
  auto* r = ctx->DefaultReactor();
  if (auto s = CheckBearer(ctx); !s.ok()) {
    r->Finish(s);
    return r;
  }
  {
    MutexLock l(&mu_);
    reply->set_run_id(run_id_);
    reply->set_round(current_round_ ? current_round_ : committed_round_);
    reply->set_total_rounds(cfg_.run.rounds);
    reply->set_connected_clients(ConnectedLocked());
    reply->set_phase(phase_);
    reply->set_last_test_accuracy(last_accuracy_);
  }
  CountUp(kCallBytesUp + WireSize(*req));
  CountDown(kCallBytesDown + WireSize(*reply));
  r->Finish(grpc::Status::OK);
  return r;
}

// ---------------------------------------------------------------------------------
// Reactor callbacks into the shared state.

void Server::Impl::RegisterUpload(std::shared_ptr<UploadReactor> r) {
  MutexLock l(&upload_mu_);
  open_uploads_[r.get()] = std::move(r);
}

void Server::Impl::UnregisterUpload(UploadReactor* r) {
  MutexLock l(&upload_mu_);
  open_uploads_.erase(r);
  if (const v1::UploadHeader* h = r->header()) {
    auto it = upload_of_client_.find(h->client_id());
    if (it != upload_of_client_.end() && it->second == r) upload_of_client_.erase(it);
  }
}

bool Server::Impl::ClaimUpload(const std::string& client_id, UploadReactor* r) {
  std::shared_ptr<UploadReactor> older;
  bool has_slot = false;
  {
    MutexLock l(&upload_mu_);
    UploadReactor*& current = upload_of_client_[client_id];
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

void Server::Impl::LogRefusedUpload(const v1::UploadHeader& h, const Status& why) {
  std::string name;
  {
    MutexLock l(&mu_);
    auto it = sessions_.find(h.client_id());
    name = it != sessions_.end() ? it->second.name : "not connected";
  }
  spdlog::warn("upload from client {} ({}) for round {} refused: {}", Printable(h.client_id()),
               name, h.round(), Printable(why.ToString(), 300));
}

void Server::Impl::CancelOpenUploads() {
  std::vector<std::shared_ptr<UploadReactor>> open;
  {
    MutexLock l(&upload_mu_);
    for (auto& [p, r] : open_uploads_) open.push_back(r);
  }
  // Outside upload_mu_: cancellation may run OnCancel inline, which takes it.
  for (auto& r : open) r->Cancel();
}

bool Server::Impl::CancelWaitingUpload(UploadReactor* r) {
  MutexLock l(&upload_mu_);
  auto it = std::find(upload_waiters_.begin(), upload_waiters_.end(), r);
  if (it == upload_waiters_.end()) return false;
  upload_waiters_.erase(it);
  return true;
}

void Server::Impl::ReleaseUploadSlot() {
  UploadReactor* next = nullptr;
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

Status Server::Impl::Join(ControlReactor* r, const v1::Join& join, const std::string& peer,
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
  std::shared_ptr<ControlReactor> replaced;
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
        replaced = it->second.reactor;
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
    s.reactor = r->shared();
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
    replaced->Close(grpc::Status(grpc::StatusCode::ABORTED,
                                 "replaced by a newer connection with the same certificate"));
  }
  return absl::OkStatus();
}

void Server::Impl::Ready(ControlReactor* r) {
  MutexLock l(&mu_);
  auto it = sessions_.find(r->client_id());
  if (it == sessions_.end()) return;
  it->second.ready = true;
  cv_.SignalAll();
}

void Server::Impl::Heartbeat(ControlReactor* r) {
  MutexLock l(&mu_);
  auto it = sessions_.find(r->client_id());
  if (it != sessions_.end()) it->second.last_seen = clock_->Now();
}

void Server::Impl::Ack(ControlReactor* r, const v1::TaskAck& ack) {
  MutexLock l(&mu_);
  auto it = tasks_.find(ack.task_id());
  if (it == tasks_.end() || it->second.client_id != r->client_id()) return;
  if (!ack.accepted() && it->second.state == TaskState::kAssigned) {
    FailTaskLocked(it->first, it->second,
                   absl::StrCat("rejected by the client: ", Printable(ack.error(), 200)));
    cv_.SignalAll();
  }
}

void Server::Impl::ControlDone(ControlReactor* r) {
  MutexLock l(&mu_);
  auto it = sessions_.find(r->client_id());
  if (it == sessions_.end() || it->second.reactor.get() != r) return;
  spdlog::info("client {} disconnected", it->first);
  FailTasksOfLocked(it->first, "disconnected");
  if (secagg_) secagg_->Drop(it->first);
  sessions_.erase(it);
  cv_.SignalAll();
}

void Server::Impl::FailTasksOfLocked(const std::string& client_id, const std::string& why) {
  for (auto& [id, t] : tasks_) {
    if (t.client_id == client_id && t.state == TaskState::kAssigned) FailTaskLocked(id, t, why);
  }
}

void Server::Impl::FailTaskLocked(const std::string& task_id, TaskRecord& t,
                                  const std::string& why) {
  spdlog::warn("task {} of client {} failed: {}", task_id, t.client_id, why);
  t.state = TaskState::kFailed;
  if (t.split && split_round_) split_round_->Fail(t.client_id);
  if (secagg_) secagg_->Drop(t.client_id);
}

Status Server::Impl::Authenticate(const std::string& client_id, const std::string& token,
                                  const std::string& peer) {
  MutexLock l(&mu_);
  return SessionLocked(client_id, token, peer).status();
}

StatusOr<const Session*> Server::Impl::SessionLocked(const std::string& client_id,
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

Status Server::Impl::SecAggSubmit(const v1::SecAggRequest& req, const std::string& peer) {
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

Status Server::Impl::SetProfile(ControlReactor* r, const v1::Profile& p) {
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
  auto it = sessions_.find(r->client_id());
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

StatusOr<SplitStreamTask> Server::Impl::OpenSplit(const v1::SplitOpen& open,
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

void Server::Impl::SplitEnded(const SplitStreamTask& task, const Status& why) {
  MutexLock l(&mu_);
  auto t = tasks_.find(task.task_id);
  if (t == tasks_.end() || t->second.client_id != task.client_id || task.round != split_round_ ||
      t->second.state != TaskState::kAssigned) {
    return;
  }
  FailTaskLocked(t->first, t->second, absl::StrCat("split stream: ", why.ToString()));
  cv_.SignalAll();
}

StatusOr<const Session*> Server::Impl::CheckSenderLocked(const std::string& what,
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
  if (current_round_ == 0 || round != current_round_) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " for round ", round, ", the current round is ", current_round_));
  }
  return s;
}

StatusOr<int64_t> Server::Impl::CheckUploadHeader(const v1::UploadHeader& h,
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
  if (t->second.state == TaskState::kDone) {
    *duplicate = true;
    return int64_t{0};
  }
  if (t->second.state == TaskState::kFailed) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", Printable(h.task_id()), " was already counted as failed"));
  }
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

std::string Server::Impl::TakeBuffer(int64_t size) {
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

void Server::Impl::ReturnBuffer(std::string buffer) {
  MutexLock l(&buffers_mu_);
  if (static_cast<int>(buffers_.size()) < cfg_.server.worker_threads) buffers_.push_back(std::move(buffer));
}

void Server::Impl::DropBuffers() {
  std::vector<std::string> drop;
  MutexLock l(&buffers_mu_);
  drop.swap(buffers_);
}

Status Server::Impl::ProcessUpload(const v1::UploadHeader& h, const std::string& payload,
                                   bool* duplicate) {
  // Structure checks need no lock; the payload is ours.
  std::vector<TensorView> views;
  if (h.codec() == "fp32") {
    ASSIGN_OR_RETURN(views, ParseParameterSet(payload, cfg_.server.max_model_elements));
  }
  MutexLock l(&mu_);
  // Re-check under the lock: the round may have closed while we were reading.
  auto t = tasks_.find(h.task_id());
  if (h.round() != current_round_ || t == tasks_.end() || t->second.client_id != h.client_id()) {
    return absl::FailedPreconditionError(
        absl::StrCat("round ", h.round(), " closed before the upload completed"));
  }
  if (t->second.state == TaskState::kDone) {
    *duplicate = true;
    return absl::OkStatus();
  }
  if (t->second.state == TaskState::kFailed) {
    return absl::FailedPreconditionError(
        absl::StrCat("task ", Printable(h.task_id()), " was already counted as failed"));
  }
  static const ParameterSet kNothing;  // an evaluation task's upload
  const ParameterSet& layout = t->second.split           ? *t->second.part
                               : t->second.evaluate_only ? kNothing
                                                         : UpdateLayout();
  if (t->second.evaluate_only && h.evaluation().examples() == 0) {
    return absl::InvalidArgumentError("an evaluation task's upload must carry its evaluation");
  }
  const int64_t weight = round_weights_.Weight(h.num_examples());
  if (h.codec() == kSecAggCodec) {
    // A masked input: checked and added into the round's sum mod M. The strategy gets
    // the round's unmasked sum when the last stage closes.
    RETURN_IF_ERROR(secagg_ ? secagg_->AddMasked(h.client_id(), payload)
                            : absl::FailedPreconditionError("no secure aggregation this round"));
  } else {
    if (h.codec() != "fp32") {
      // Checked here, then read block by block through the codec like an fp32 update:
      // no decoded copy is made. O(model) under the lock, as is accumulating.
      ASSIGN_OR_RETURN(views, ViewEncodedTensors(*update_codec_, payload, layout));
    }
    // Bounded values: with bounded weights no sum of updates can overflow, so no upload
    // can make the model non-finite.
    RETURN_IF_ERROR(CheckViews(layout, views, static_cast<float>(cfg_.server.max_update_abs)));
    if (t->second.split) {
      // The client's trained part: the part it was given plus its delta (with LoRA,
      // the adapters; the frozen tensors are as the round started).
      ParameterSet trained = *t->second.part;
      for (size_t i = 0; i < views.size(); ++i) {
        auto& v = trained.mutable_tensors()[i].values;
        std::vector<float> delta(v.size());
        views[i].Read(0, views[i].numel, delta.data());
        for (size_t j = 0; j < v.size(); ++j) v[j] += delta[j];
      }
      if (!frozen_.empty()) {
        ASSIGN_OR_RETURN(ParameterSet whole, split_round_->ClientPart(h.client_id()));
        RETURN_IF_ERROR(Overwrite(trained, &whole));
        trained = std::move(whole);
      }
      RETURN_IF_ERROR(split_round_->Finish(h.client_id(), trained, weight));
      t->second.stats = h.split();
    } else if (!t->second.evaluate_only) {
      strategy_->Accumulate(views, weight);
    }
  }
  if (h.codec() != "fp32") {
    SavedUp(static_cast<int64_t>(layout.EncodedSize()) - static_cast<int64_t>(payload.size()));
  }
  update_bytes_ += static_cast<int64_t>(payload.size());
  t->second.state = TaskState::kDone;
  t->second.train_loss = h.train_loss();
  t->second.num_examples = weight;
  t->second.evaluation = h.evaluation();
  if (h.evaluation().examples() > 0) clients_evaluate_ = true;
  t->second.train_seconds = h.train_seconds();
  if (t->second.evaluate_only) {
    spdlog::info("round {}: evaluation from {} accepted (accuracy {:.4f} on {} examples)",
                 current_round_, h.client_id(), h.evaluation().accuracy(), h.evaluation().examples());
  } else {
    spdlog::info("round {}: update from {} accepted ({} examples, weight {}, loss {:.4f}, {:.1f}s)",
                 current_round_, h.client_id(), h.num_examples(), weight, h.train_loss(),
                 h.train_seconds());
  }
  cv_.SignalAll();
  return absl::OkStatus();
}

StatusOr<std::shared_ptr<const std::string>> Server::Impl::FindBlob(const v1::FetchRequest& req,
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

Status Server::Impl::Init() {
  MutexLock l(&mu_);  // nothing else runs yet; the annotations still hold
  if (cfg_.tls.cert.empty() && !opts_.insecure) {
    return absl::FailedPreconditionError(
        "TLS is required: set tls.cert and tls.key (`cleave certs init DIR` makes them) or "
        "run with --insecure for plaintext");
  }
  if (cfg_.tls.mutual && (cfg_.tls.cert.empty() || cfg_.tls.ca.empty())) {
    return absl::InvalidArgumentError("tls.mutual needs tls.cert, tls.key and tls.ca");
  }
  if (!cfg_.auth.token_file.empty()) {
    ASSIGN_OR_RETURN(std::string token, ReadBearerToken(cfg_.auth.token_file));
    if (token.size() < 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "auth.token_file: ", cfg_.auth.token_file, " holds ", token.size(),
          " characters; a bearer token needs at least 16"));
    }
    bearer_ = "Bearer " + token;
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

Status Server::Impl::InitSplit(const ModelSpec& spec) {
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

StatusOr<std::shared_ptr<grpc::ServerCredentials>> Server::Impl::ServerCredentials() {
  const TlsConfig& t = cfg_.tls;
  if (t.cert.empty()) {
    spdlog::warn("--insecure: TLS is off; clients, their updates and any bearer token travel "
                 "in plaintext");
    return grpc::InsecureServerCredentials();
  }
  // Refuse to serve with material no client could handshake with; then serve a checked
  // copy, which ReloadTlsLoop replaces only by material that passes the same checks.
  ASSIGN_OR_RETURN(tls_material_, ReadServerTls(t.cert, t.key, t.ca));
  if (!t.revoked.empty()) {
    ASSIGN_OR_RETURN(std::set<std::string> revoked, ReadRevocationList(t.revoked));
    MutexLock l(&mu_);
    revoked_ = std::move(revoked);
  }
  if (opts_.run_dir.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cleave-tls-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError("cannot create a TLS staging directory");
    }
    tls_dir_ = tmpl;
  } else {
    tls_dir_ = Path("tls");
  }
  RETURN_IF_ERROR(StageTls(tls_material_));
  const std::string cur = tls_dir_ + "/current/";
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      cur + "key.pem", cur + "cert.pem", t.ca.empty() ? "" : cur + "ca.pem",
      std::max(1, t.reload_s / 2));
  grpc::experimental::TlsServerCredentialsOptions o(provider);
  o.watch_identity_key_cert_pairs();
  if (!t.ca.empty()) o.watch_root_certs();
  o.set_cert_request_type(t.mutual ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                   : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  spdlog::info("TLS on: {}{}", t.cert, t.mutual ? ", client certificates required (mutual TLS)" : "");
  return grpc::experimental::TlsServerCredentials(o);
}

Status Server::Impl::StageTls(const TlsMaterial& m) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(tls_dir_) / absl::StrCat("v", ++tls_version_);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  }
  fs::permissions(tls_dir_, fs::perms::owner_all, ec);
  RETURN_IF_ERROR(WriteFileAtomic((dir / "cert.pem").string(), m.cert_chain));
  RETURN_IF_ERROR(WriteFileAtomic((dir / "key.pem").string(), m.key));
  fs::permissions(dir / "key.pem", fs::perms::owner_read | fs::perms::owner_write, ec);
  if (!m.ca.empty()) RETURN_IF_ERROR(WriteFileAtomic((dir / "ca.pem").string(), m.ca));
  const fs::path link = fs::path(tls_dir_) / "current", tmp = fs::path(tls_dir_) / "current.tmp";
  fs::remove(tmp, ec);
  fs::create_directory_symlink(dir.filename(), tmp, ec);
  if (!ec) fs::rename(tmp, link, ec);  // atomic: the watcher sees the old or the new pair
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot switch ", link.string(), ": ", ec.message()));
  }
  fs::remove_all(fs::path(tls_dir_) / absl::StrCat("v", tls_version_ - 2), ec);
  return absl::OkStatus();
}

void Server::Impl::ReloadTlsLoop() {
  const TlsConfig& t = cfg_.tls;
  while (true) {
    {
      MutexLock l(&mu_);
      const Clock::time_point next = clock_->Now() + Seconds(t.reload_s);
      while (!stopping_ && clock_->Now() < next) clock_->WaitUntil(cv_, mu_, next);
      if (stopping_) return;
    }
    auto m = ReadServerTls(t.cert, t.key, t.ca);
    if (!m.ok()) {
      spdlog::error("TLS reload: keeping the current certificate and key: {}",
                    std::string(m.status().message()));
    } else if (m->cert_chain != tls_material_.cert_chain || m->key != tls_material_.key ||
               m->ca != tls_material_.ca) {
      if (Status s = StageTls(*m); !s.ok()) {
        spdlog::error("TLS reload: {}", s.ToString());
      } else {
        tls_material_ = *std::move(m);
        spdlog::info("TLS reload: new certificate material from {}", t.cert);
      }
    }
    if (!t.revoked.empty()) {
      auto revoked = ReadRevocationList(t.revoked);
      if (!revoked.ok()) {
        spdlog::error("TLS reload: keeping the current revocation list: {}",
                      std::string(revoked.status().message()));
      } else {
        ApplyRevocations(*std::move(revoked));
      }
    }
  }
}

void Server::Impl::ApplyRevocations(std::set<std::string> revoked) {
  std::vector<std::shared_ptr<ControlReactor>> cut;
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
      cut.push_back(std::move(it->second.reactor));
      it = sessions_.erase(it);
    }
    cv_.SignalAll();
  }
  for (auto& r : cut) {  // never start gRPC operations under mu_
    r->Close(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "certificate revoked"));
  }
}

Status Server::Impl::Start() {
  const std::string addr = opts_.listen.empty() ? cfg_.server.listen : opts_.listen;
  {
    // Every session holds a connection (a descriptor); keep room for files, threads and
    // connections still handshaking.
    rlimit r{};
    const int64_t fds = getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur != RLIM_INFINITY
                            ? static_cast<int64_t>(r.rlim_cur)
                            : 1 << 20;
    const int derived = static_cast<int>(std::clamp<int64_t>((fds - 64) / 2, 1, 1 << 20));
    // Connections beyond the cap are closed at accept (accept_gate.h): the rest of the
    // descriptors stay for run files, gRPC's own and the spare.
    const int connections = cfg_.server.max_connections > 0
                                ? cfg_.server.max_connections
                                : static_cast<int>(std::clamp<int64_t>(fds - 128, 16, 1 << 20));
    SetConnectionLimit(connections);
    MutexLock l(&mu_);
    max_sessions_ = cfg_.server.max_sessions > 0 ? cfg_.server.max_sessions : derived;
    spdlog::info("up to {} sessions and {} connections ({} descriptors)", max_sessions_,
                 connections, fds);
  }
  ASSIGN_OR_RETURN(auto credentials, ServerCredentials());
  grpc::ServerBuilder b;
  b.AddListeningPort(addr, credentials, &port_);
  // Two servers on one port would split the federation between them (gRPC sets
  // SO_REUSEPORT by default): binding a port in use must fail.
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // A connection that does not finish its TLS and HTTP/2 handshakes in time is closed,
  // so idle connections cannot pile up before authentication.
  b.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                       static_cast<int>(cfg_.server.handshake_timeout_s * 1000));
  // ... and one that carries no call for a minute (a client keeps its control stream
  // open, so only abandoned connections go).
  b.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 60000);
  b.RegisterService(this);
  // Accept client keepalive pings (clients ping every 20 s while idle).
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Fixed HTTP/2 receive windows of 128 KiB per stream instead of BDP auto-tuning,
  // which grows them to many MiB: a queued upload (see ClaimUpload) then holds at
  // most 128 KiB in gRPC's buffers. Costs upload speed only on long-RTT links
  // (128 KiB per round trip); downloads are governed by the client's window.
  b.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  b.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 128 << 10);
  grpc_server_ = b.BuildAndStart();
  if (!grpc_server_ || port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", addr, ": address in use, or not an address of this machine"));
  }
  if (!cfg_.tls.cert.empty()) tls_thread_ = std::thread([this] { ReloadTlsLoop(); });
  spdlog::info("run {} listening on port {}", RunId(), port_);
  if (!opts_.run_dir.empty()) {
    const std::string host = addr.substr(0, addr.rfind(':'));
    const std::string dial = (host == "0.0.0.0" || host == "[::]") ? "127.0.0.1" : host;
    RETURN_IF_ERROR(WriteFileAtomic(Path("server.addr"), absl::StrCat(dial, ":", port_, "\n")));
  }
  return absl::OkStatus();
}

void Server::Impl::PublishModelLocked() {
  ParameterSet scratch;
  auto blob = std::make_shared<const std::string>(ModelBlob(Published(global_, scratch)));
  PublishLocked(std::move(blob), Sha256Hex(*blob));
}

void Server::Impl::PublishLocked(std::shared_ptr<const std::string> blob, std::string digest) {
  for (auto it = blobs_.begin(); it != blobs_.end();) {  // drop the previous model version
    it = pinned_blobs_.count(it->first) ? std::next(it) : blobs_.erase(it);
  }
  fp32_sizes_.clear();
  // The fp32 size of what the blob of the new model (global_) holds.
  ParameterSet scratch;
  fp32_sizes_[digest] = static_cast<int64_t>(Published(global_, scratch).EncodedSize());
  model_digest_ = std::move(digest);
  blobs_[model_digest_] = std::move(blob);
}

int Server::Impl::ConnectedLocked() const {
  int n = 0;
  for (const auto& [id, s] : sessions_) n += s.ready;
  return n;
}

std::vector<std::string> Server::Impl::AvailableLocked() const {
  std::vector<std::string> ids;
  for (const auto& [id, s] : sessions_) {
    if (s.ready && (s.has_profile || !NeedProfile())) ids.push_back(id);
  }
  // Sort numerically (c2 before c10) so sampling is reproducible and readable.
  std::sort(ids.begin(), ids.end(), [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  return ids;
}

void Server::Impl::ExpireSilentLocked() {
  const auto limit = Seconds(cfg_.server.client_timeout_s);
  const auto now = clock_->Now();
  std::vector<std::shared_ptr<UploadReactor>> stalled;
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
  std::vector<std::shared_ptr<ControlReactor>> silent;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (now - it->second.last_seen > limit) {
      spdlog::warn("client {} silent for {:.0f}s: dropping it", it->first,
                   cfg_.server.client_timeout_s);
      FailTasksOfLocked(it->first, "heartbeat timeout");
      silent.push_back(std::move(it->second.reactor));
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
  if (silent.empty() && stalled.empty()) return;
  mu_.Unlock();
  for (auto& r : silent) r->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "heartbeat timeout"));
  for (auto& r : stalled) r->Cancel();
  mu_.Lock();
}

bool Server::Impl::RoundResolvedLocked() const {
  for (const auto& [id, t] : tasks_) {
    if (t.state == TaskState::kAssigned) return false;
  }
  return true;
}

v1::ServerMessage Server::Impl::MakeTaskLocked(int64_t round, const std::string& cid,
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
  tc->set_seed(cfg_.run.seed * 1000003 + round);
  task->set_deadline_unix_ms(deadline_ms);
  TaskRecord rec;
  rec.client_id = cid;
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

CutProblem Server::Impl::ProblemFor(const Session& s, int clients_in_round) const {
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

StatusOr<std::vector<std::string>> Server::Impl::BeginSplitRoundLocked(
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

StatusOr<RoundMetrics> Server::Impl::RunRound(bool evaluate_only) {
  const int64_t round = evaluate_only ? committed_round_ : committed_round_ + 1;
  // Wait for enough clients.
  phase_ = "waiting for clients";
  const auto join_deadline = clock_->Now() + Seconds(cfg_.clients.join_timeout_s);
  while (!stopping_ && static_cast<int>(AvailableLocked().size()) < cfg_.clients.min_clients) {
    if (clock_->Now() > join_deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "only ", AvailableLocked().size(), " of clients.min=", cfg_.clients.min_clients,
          " clients connected", NeedProfile() ? " and profiled" : "", " within ",
          cfg_.clients.join_timeout_s, "s"));
    }
    WaitLocked(join_deadline);
    ExpireSilentLocked();
  }
  if (stopping_) return absl::CancelledError("stopped");

  const auto start = clock_->Now();  // wall_s: from sampling to commit
  RoundPlan plan;
  if (evaluate_only) {  // every connected client; the strategy's state is left alone
    plan.clients = AvailableLocked();
    plan.fit.loss = cfg_.train.loss;
  } else {
    plan = strategy_->ConfigureRound(round, AvailableLocked(), rng_);
  }
  if (!plan.stop_reason.empty()) return absl::OutOfRangeError(plan.stop_reason);
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
  auto send = [&](const std::vector<std::string>& cids) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::pair<std::shared_ptr<ControlReactor>, v1::ServerMessage>> sends;
    for (const std::string& cid : cids) {
      sends.emplace_back(sessions_[cid].reactor, MakeTaskLocked(round, cid, plan.fit, deadline_ms));
    }
    mu_.Unlock();  // never start gRPC operations under mu_
    std::vector<std::string> unsent;
    for (auto& [reactor, msg] : sends) {
      if (!reactor->Send(msg)) unsent.push_back(msg.task().task_id());
    }
    mu_.Lock();
    for (const auto& id : unsent) {
      auto& t = tasks_[id];
      if (t.state == TaskState::kAssigned) FailTaskLocked(id, t, "control stream closed");
    }
  };
  send(first);
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
        send({next});
      } else {
        spdlog::warn("round {}: client {} left before its turn", round, next);
        ++lost_turns;
      }
      continue;
    }
    WaitLocked(deadline);
    ExpireSilentLocked();
  }
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
  // The server update, encoding and hashing of a large model take a while: do them on a
  // copy without the lock. The round is closed (current_round_ == 0), so no upload
  // touches the strategy meanwhile, and readers of global_ see the previous model.
  ParameterSet next = not_updated_.empty() ? global_ : Without(global_, not_updated_);
  std::shared_ptr<SplitRound> split_round = std::move(split_round_);
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
    if (secagg) finished = AccumulateSecAgg(*secagg, weight, next);
    if (finished.ok() && root_.size > 0) {
      finished = SetFlTrustReference(RunThreadGlobal(), plan.fit);
    }
    if (finished.ok()) finished = strategy_->FinishRound(m.failures, &next);
    if (finished.ok()) m.strategy_stats = strategy_->RoundStats();
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
  m.wall_s = std::chrono::duration<double>(clock_->Now() - start).count();
  return m;
}

Status Server::Impl::BeginSecAggLocked(int64_t round, const std::vector<std::string>& clients) {
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

Status Server::Impl::RunSecAggStagesLocked(Clock::time_point training_deadline) {
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
    std::vector<std::pair<std::string, std::shared_ptr<ControlReactor>>> to;
    for (auto& [cid, msg] : *next) {
      const std::string task_id = absl::StrCat("r", current_round_, "-", cid);
      if (msg.has_secagg_neighbours()) msg.mutable_secagg_neighbours()->set_task_id(task_id);
      if (msg.has_secagg_relay()) msg.mutable_secagg_relay()->set_task_id(task_id);
      if (msg.has_secagg_unmask()) msg.mutable_secagg_unmask()->set_task_id(task_id);
      auto s = sessions_.find(cid);
      if (s == sessions_.end()) {
        secagg_->Drop(cid);
      } else {
        to.emplace_back(cid, s->second.reactor);
      }
    }
    mu_.Unlock();  // never start gRPC operations under mu_
    std::vector<std::string> unsent;
    for (auto& [cid, reactor] : to) {
      if (!reactor->Send((*next)[cid])) unsent.push_back(cid);
    }
    mu_.Lock();
    for (const auto& cid : unsent) {
      if (secagg_) secagg_->Drop(cid);
    }
    stage_deadline = clock_->Now() + timeout;
  }
  return absl::OkStatus();
}

Status Server::Impl::AccumulateSecAgg(const SecAggRound& round, int64_t total_examples,
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

Status Server::Impl::SetFlTrustReference(const ParameterSet& global, const FitSettings& fit) {
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

void Server::Impl::FinalEvaluation(double elapsed_s) {
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

Status Server::Impl::Commit(RoundMetrics* m) {
  // Called without mu_ held: evaluation and disk writes take a while, and reactors must
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

std::string Server::Impl::CheckpointLocked(double elapsed_s) const {
  Checkpoint ck;
  ck.run_id = run_id_;
  ck.round = committed_round_;
  ParameterSet scratch;
  ck.global = Published(global_, scratch);  // exact, whatever the broadcast codec
  ck.strategy_state = strategy_->State();
  ck.rng = rng_;
  ck.bytes_up = total_bytes_up_;
  ck.bytes_down = total_bytes_down_;
  ck.wall_s = elapsed_s;
  return EncodeCheckpoint(ck);
}

Status Server::Impl::LoadCheckpoint() {
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
  spdlog::info("resuming run {} after round {}", run_id_, committed_round_);
  return TrimMetrics();
}

Status Server::Impl::TrimMetrics() {
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

Status Server::Impl::Run() {
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
      m = RunRound();
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

void Server::Impl::DisconnectClients() {
  std::vector<std::shared_ptr<ControlReactor>> reactors;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    phase_ = "stopped";
    for (auto& [id, s] : sessions_) reactors.push_back(s.reactor);
  }
  for (auto& r : reactors) {
    r->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the server is stopping; reconnect to resume the run"));
  }
}

void Server::Impl::EndRun(const std::string& reason) {
  std::vector<std::shared_ptr<ControlReactor>> reactors;
  v1::ServerMessage msg;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    phase_ = "ended";
    for (auto& [id, s] : sessions_) reactors.push_back(s.reactor);
    msg.mutable_run_ended()->set_run_id(run_id_);
    msg.mutable_run_ended()->set_reason(reason);
  }
  for (auto& r : reactors) r->Send(msg, /*finish_after=*/true);
  // Give clients a moment to read RunEnded, then stop serving: a grace period of real
  // time for the network, not a protocol deadline.
  MutexLock l(&mu_);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!sessions_.empty() && !cv_.WaitUntil(&mu_, until)) {
  }
}

void Server::Impl::Stop() {
  MutexLock l(&mu_);
  stopping_ = true;
  cv_.SignalAll();
}

// ---------------------------------------------------------------------------------

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { impl_->Stop(); }

Server::Impl::~Impl() {
  Stop();
  if (tls_thread_.joinable()) tls_thread_.join();
  // Cancels calls still open after a grace period and waits for every reactor's OnDone,
  // while the worker pool (destroyed first among the members) can still finish uploads.
  if (grpc_server_) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  if (opts_.run_dir.empty() && !tls_dir_.empty()) {  // a temporary staging directory
    std::error_code ec;
    std::filesystem::remove_all(tls_dir_, ec);
  }
}

StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options) {
  // Upload payloads and model encodings are MBs, allocated and freed every round on
  // several threads. glibc raises its mmap threshold after each large free, so without
  // a fixed one such buffers move into per-thread arenas that keep the memory: peak RSS
  // then depends on which thread freed what (bench_server_memory --codec int8: 3.8-4.5x
  // the model, 3.7x with this).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  if (!options.config.server.evaluate) options.evaluate = false;  // no test set on the server
  auto impl = std::make_unique<Impl>(std::move(options));
  RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Status Server::Start() { return impl_->Start(); }
int Server::port() const { return impl_->port(); }
Status Server::Run() { return impl_->Run(); }
void Server::Stop() { impl_->Stop(); }
ParameterSet Server::GlobalModel() const { return impl_->GlobalModel(); }
int64_t Server::committed_round() const { return impl_->committed_round(); }
std::vector<RoundMetrics> Server::History() const { return impl_->History(); }
std::pair<int64_t, int64_t> Server::TransportBytes() const { return impl_->TransportBytes(); }
Server::UploadCounts Server::Uploads() const { return impl_->Uploads(); }

}  // namespace cleave
