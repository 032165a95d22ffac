// The transport-free coordinator: sessions keyed by client id, the round loop, the
// strategy, secure aggregation and split learning. The transport (server/rpc.h) turns
// calls into these methods and implements ClientLink and UploadCall for them; the core
// holds no gRPC types, so rounds run the same behind any transport.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "aggregation/staleness.h"
#include "aggregation/strategy.h"
#include "aggregation/weighting.h"
#include "cleave/v1/cleave.pb.h"
#include "compression/codec.h"
#include "core/clock.h"
#include "core/files.h"
#include "core/mutex.h"
#include "core/parameter_set.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "data/dataset.h"
#include "models/model.h"
#include "server/checkpoint.h"
#include "server/observe.h"
#include "server/round_driver.h"
#include "server/secagg_round.h"
#include "server/selection.h"
#include "server/server.h"
#include "server/transport.h"
#include "server/upload_slots.h"
#include "split/cut_policy.h"
#include "split/round.h"

namespace cleave {

class RoundScheduler;  // server/scheduler.h
class SyncRounds;
class AsyncBuffers;
class SecAggDriver;  // server/secagg_driver.h
class SplitDriver;   // server/split_driver.h
class GossipDriver;  // server/gossip_driver.h

// Constant-time comparison, so response timing does not leak a token byte by byte.
bool TokenMatches(const std::string& expected, const std::string& given);

// Hex of `bytes` bytes from OpenSSL's CSPRNG: tokens and run ids must not be guessable.
std::string RandomHex(int bytes);

// The codec name of a masked secure-aggregation input in UploadHeader.codec.
inline constexpr char kSecAggCodec[] = "secagg";

// kAccumulating: its upload passed the checks made under the coordinator's lock and is
// being validated and added without it (ProcessUpload); it ends kDone, or kAssigned
// again if refused.
enum class TaskState { kAssigned, kAccumulating, kDone, kFailed };

struct TaskRecord {
  std::string client_id;
  TaskState state = TaskState::kAssigned;
  // The round it was given in: its client trains from the model of round - 1. In async
  // mode the version being built then; tasks outlive it there.
  int64_t round = 0;
  // async: the version its update went into (kDone) or in which it failed (kFailed), its
  // staleness when added, when it fails unless uploaded, and why it failed.
  int64_t resolved_in = 0;
  int64_t staleness = 0;
  Clock::time_point deadline;
  std::string failure;
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
  Clock::time_point done_at;  // when its upload was accepted
  // async: when it was sent, and the local steps it was given (staleness control).
  Clock::time_point sent;
  int64_t steps = 0;
  bool evaluate_only = false;  // an evaluation task: its upload is an empty parameter set
  // A gossip task: its upload is an empty parameter set whose header reports the exchange.
  bool gossip = false;
  v1::GossipStats gossip_stats;
};

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
  std::string peer_address;  // where it serves Peer (gossip rounds); empty: it does not
  std::shared_ptr<ClientLink> link;  // its control stream
  bool ready = false;  // Welcome queued: tasks may follow it
  Clock::time_point last_seen;
  // Split learning with cut: auto.
  bool has_profile = false;
  v1::Profile profile;
  CutFeedback feedback;
  CutPrediction prediction;  // of the last round's cut
  // async: its measured speed, which sizes its tasks (scheduler.target_staleness).
  ClientSpeed speed;
  // gossip: the uplink its sends to neighbours measured (GossipStats.uplink_mbps), an
  // average over rounds with weight 1/2 on the newest; 0 until measured.
  double uplink_mbps = 0;  // What the operator sees of it (Observe): tasks accepted and failed, the last accepted
  // task's training time and (split) mean step time.
  int64_t done = 0, failures = 0;
  double task_s = 0, step_s = 0;
};

class Coordinator {
 public:
  explicit Coordinator(ServerOptions o);

  ~Coordinator();
  // Validates the options, loads the model, the test data and a checkpoint.
  Status Init();
  // Runs rounds until the run ends (see Server::Run).
  Status Run();
  void Stop();

  // Edge aggregation (Server::WaitForClients, RunEdgeRound, Finish).
  StatusOr<int64_t> WaitForClients();
  StatusOr<EdgeRound> RunEdgeRound(const ParameterSet& start, const FitSettings& fit,
                                   uint64_t seed);
  void Finish(const std::string& reason) { EndRun(reason); }

  // --- called by the transport ---
  const ServerOptions& options() const { return opts_; }
  // Sets the session cap: server.max_sessions, or else `derived` (the transport's bound
  // from its descriptors). Returns the cap.
  int SetMaxSessions(int derived);
  // tls.revoked: identities refused at Join; the live sessions of newly revoked ones end.
  void Revoke(std::set<std::string> revoked);
  // `peer`: the CN of the client's certificate (mutual TLS), which becomes its name.
  // `link` is the client's control stream; on success the session holds it.
  Status Join(std::shared_ptr<ClientLink> link, const v1::Join& join, const std::string& peer,
              v1::Welcome* welcome);
  // After the Welcome is queued: the client may now be given tasks.
  void Ready(const std::string& client_id);
  void Heartbeat(const std::string& client_id);
  void Ack(const std::string& client_id, const v1::TaskAck& ack);
  // The control stream `link` of `client_id` ended (a newer one may have replaced it).
  void ControlDone(const std::string& client_id, const ClientLink* link);
  // The run's state for `cleave status`.
  void FillStatus(v1::StatusReply* reply) const;
  // Checks an upload header; on success returns the exact expected payload size.
  StatusOr<int64_t> CheckUploadHeader(const v1::UploadHeader& h, const std::string& peer,
                                      bool* duplicate);
  // Validates and aggregates a complete upload (runs on the worker pool): claims its
  // task under mu_, checks and adds it without (docs/architecture.md, "The server").
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
  Status SetProfile(const std::string& client_id, const v1::Profile& profile);
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
  // Upload admission (server/upload_slots.h), used by the transport's upload calls.
  UploadSlots& uploads() { return uploads_; }
  // A refused upload, logged with the sender's identity (names escaped and bounded).
  void LogRefusedUpload(const v1::UploadHeader& h, const Status& why);
  int chunk_bytes() const { return cfg_.server.chunk_bytes; }

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
  std::string RunId() const {
    MutexLock l(&mu_);
    return run_id_;
  }
  std::pair<int64_t, int64_t> TransportBytes() const { return {lifetime_up_, lifetime_down_}; }
  // The operator's view (server/observe.h), and the latencies the transport measures.
  // `history`: with every round's metrics (the dashboard), not only the last's.
  ObservedState Observe(bool history) const;
  void ObserveUpload(double seconds) { upload_latency_.Observe(seconds); }
  void ObserveFetch(double seconds) { fetch_latency_.Observe(seconds); }
  Server::UploadCounts Uploads() const {
    const UploadSlots::Counts c = uploads_.counts();
    return {c.in_progress, c.waiting};
  }

 private:
  // Its schedulers and drivers are parts of it: they work on its round state.
  friend class SyncRounds;
  friend class TurnRounds;
  friend class AsyncBuffers;
  friend class SecAggDriver;
  friend class SplitDriver;
  friend class GossipDriver;

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
  // split.cut: auto: clients take part once they sent a Profile.
  bool NeedProfile() const;
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
  // Marks `t` done with upload `h`'s report (bytes, loss, weight, evaluation).
  void AcceptLocked(TaskRecord& t, const v1::UploadHeader& h, int64_t weight,
                    size_t payload_size, const ParameterSet& layout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FLTrust: trains `global` on the root data with the round's local settings (as the
  // paper does) and hands the change to the strategy. Runs on the round thread without
  // mu_ (it owns model_ then).
  Status SetFlTrustReference(const ParameterSet& global, const FitSettings& fit);
  // Steps the strategy into model `round` on a copy, without mu_, and publishes it;
  // `fold` first hands the strategy what is not an upload (a driver's result, FLTrust's
  // reference), given the round's model in the update layout. A model that is not
  // finite is never published: ABORTED, and the strategy's state is restored.
  Status ApplyLocked(int64_t round,
                     const std::function<Status(const ParameterSet& layout)>& fold,
                     RoundMetrics* m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A round (or buffer) opens: no tasks yet, the byte counters at zero.
  void OpenRoundLocked(int64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResetRoundBytes();
  // The round's byte counts into `m`.
  void CountRoundBytesLocked(RoundMetrics* m) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until no upload is being added outside the lock (CPU work, not a client).
  void AwaitAccumulatingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands the strategy a result that is no single client's (a driver's), in shard 0.
  void AccumulateUnnamed(std::vector<TensorView> delta, int64_t weight);
  // The deadline clients are told: Unix milliseconds `seconds` from now.
  static int64_t UnixMsIn(double seconds);
  // Waits for clients.min available clients: DEADLINE_EXCEEDED after
  // clients.join_timeout_s, CANCELLED when stopped.
  Status AwaitClientsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends each of `cids` its task of `round` (MakeTaskLocked); a task whose control
  // stream is closed fails. Releases mu_ while sending.
  void SendTasksLocked(int64_t round, const std::vector<std::string>& cids,
                       const RoundPlan& plan, int64_t deadline_ms)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status Commit(RoundMetrics* m);
  // After the last round: the final model's federated evaluation, when clients hold
  // data out (server.final_evaluation). Appended to metrics.jsonl; never fails the run.
  void FinalEvaluation(double elapsed_s);
  // Init's steps. How rounds run: the round driver of the job's mode, the scheduler
  // (synchronous rounds, turns, or async buffers) and Oort's selector.
  void ChooseRoundsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The model: built, its starting weights, the TorchScript archive and loss as pinned
  // blobs, the description tasks carry.
  StatusOr<ModelSpec> LoadModelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DescribeModelLocked(const ModelSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Which tensors updates leave out: personal layers and a LoRA model's frozen base
  // (pinned as the base blob).
  Status SplitLayoutLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // data.test (server evaluation) and aggregation.root_data (FLTrust).
  Status LoadDataLocked(const ModelSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // compression.*: each codec checked for its direction; errors name the key.
  Status MakeCodecs();
  Status LoadCheckpoint() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The strategy's State(), taken with every shard's mutex held (no Accumulate runs).
  // The analysis cannot follow a loop over an array of mutexes.
  ParameterSet StrategyState() const ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // The serialized checkpoint of the last committed round.
  std::string CheckpointLocked(double elapsed_s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps only the metrics.jsonl lines of rounds <= committed_round_, and notes from them
  // whether clients evaluate and which round's model had its final evaluation.
  Status TrimMetrics() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells every client the run ended (RunEnded): they exit.
  void EndRun(const std::string& reason);
  // Closes every control stream with UNAVAILABLE: clients reconnect (server stopped).
  void DisconnectClients();
  std::string Path(const std::string& name) const {
    return (std::filesystem::path(opts_.run_dir) / name).string();
  }

  const ServerOptions opts_;
  const JobConfig& cfg_;

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

  // How rounds run (fixed by Init). The kind of round: plain federated (plain_driver_),
  // secure aggregation or split learning (mode_driver_ points at the one); driver_ is
  // the driver of the round in progress (plain_driver_ between rounds and in an
  // evaluation round). rounds_ runs synchronous rounds with mode_driver_ (also the
  // final evaluation and an edge's rounds); scheduler_ builds the run's versions: rounds_,
  // or async_ in scheduler.mode: async.
  RoundDriver plain_driver_;
  std::unique_ptr<SecAggDriver> secagg_;
  std::unique_ptr<SplitDriver> split_;
  std::unique_ptr<GossipDriver> gossip_;
  RoundDriver* mode_driver_ = &plain_driver_;
  RoundDriver* driver_ ABSL_GUARDED_BY(mu_) = &plain_driver_;
  std::unique_ptr<SyncRounds> rounds_;
  std::unique_ptr<AsyncBuffers> async_;
  RoundScheduler* scheduler_ = nullptr;

  // Time for every deadline and timeout (ServerOptions::clock; the real one by default).
  const std::shared_ptr<Clock> clock_;
  // How often waits wake to expire silent clients and stalled uploads.
  static constexpr Clock::duration kPoll = std::chrono::milliseconds(200);

  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string run_id_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<RunFiles> run_files_;  // metrics.jsonl and checkpoint.pb (with a run dir)
  // server.max_sessions, or derived from the descriptor limit
  int max_sessions_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> revoked_ ABSL_GUARDED_BY(mu_);  // tls.revoked: identities refused at once
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
  // clients.selection: oort (null for uniform).
  std::unique_ptr<OortSelector> oort_ ABSL_GUARDED_BY(mu_);
  // An edge round's settings and batch seed, from the upstream task (RunEdgeRound).
  std::optional<FitSettings> edge_fit_ ABSL_GUARDED_BY(mu_);
  uint64_t edge_seed_ ABSL_GUARDED_BY(mu_) = 0;
  // The digests of the newest model versions, which tasks may still fetch
  // (RoundScheduler::VersionsKept).
  std::deque<std::string> recent_models_ ABSL_GUARDED_BY(mu_);
  // Tasks in TaskState::kAccumulating: the round does not close while there are any.
  int accumulating_ ABSL_GUARDED_BY(mu_) = 0;
  // The strategy's partial aggregates (Strategy::BeginRound's shards): one per worker,
  // and the last for other threads. shard_mu_[i] is taken around Accumulate into shard
  // i, which uploads call without mu_ while a round is open; the round thread uses the
  // strategy otherwise only when none is in flight (or, for a checkpoint, with every
  // shard's mutex).
  const int shards_;
  const std::unique_ptr<Mutex[]> shard_mu_;
  Mutex buffers_mu_;  // after mu_ when taken with it
  std::vector<std::string> buffers_ ABSL_GUARDED_BY(buffers_mu_);
  std::atomic<int64_t> lifetime_up_{0}, lifetime_down_{0};
  std::string phase_ ABSL_GUARDED_BY(mu_) = "starting";
  double last_accuracy_ ABSL_GUARDED_BY(mu_) = 0;

  UploadSlots uploads_;

  LatencyHistogram upload_latency_, fetch_latency_;

  ThreadPool pool_;  // last member: its workers finish before the state above dies
};


}  // namespace cleave
