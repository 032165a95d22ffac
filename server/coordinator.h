// The transport-free coordinator: sessions keyed by client id, the round loop, the
// strategy, secure aggregation and split learning. The transport (server/transport/rpc.h) turns
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
#include "server/blob_store.h"
#include "server/checkpoint.h"
#include "server/model_state.h"
#include "server/observe/observe.h"
#include "server/observe/update_noise.h"
#include "server/rounds/machinery.h"
#include "server/rounds/round_context.h"
#include "server/rounds/round_driver.h"
#include "server/rounds/round_state.h"
#include "server/rounds/selection.h"
#include "server/rounds/sharded_strategy.h"
#include "server/run_log.h"
#include "server/server.h"
#include "server/session_table.h"
#include "server/task_assets.h"
#include "server/traffic_meter.h"
#include "server/transport/buffer_pool.h"
#include "server/transport/transport.h"
#include "server/transport/upload_slots.h"

namespace cleave {

class RoundScheduler;  // server/rounds/scheduler.h
class SyncRounds;
class SecAggDriver;  // server/modes/secagg_driver.h
class SplitDriver;   // server/modes/split_driver.h

// The coordinator owns the run's state and its parts: the schedulers and round drivers
// (built by Init for the job's mode), which reach that state only through RoundContext,
// the transport's upload slots, the run files. The transport calls its public methods.
class Coordinator : private RoundContext {
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
  // Upload payload buffers, reused by the uploads of a round.
  BufferPool& buffers() { return buffers_; }
  // The blob a Fetch asks for, and what its fp32 encoding would take.
  StatusOr<std::shared_ptr<const std::string>> FindBlob(const v1::FetchRequest& req,
                                                        const std::string& peer,
                                                        int64_t* fp32_size);
  // Transport bytes (WireSize) of the round, and what compression saved against fp32.
  void CountDown(int64_t n) { traffic_.Down(n); }
  void CountUp(int64_t n) { traffic_.Up(n); }
  void SavedDown(int64_t n) { traffic_.SavedDown(n); }
  void SavedUp(int64_t n) { traffic_.SavedUp(n); }
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
  void CountSplitUp(int64_t bytes);
  void CountLabels(int64_t labels);
  void CountSplitDown(int64_t bytes);
  // The bytes of the probe blob clients time their downlink with when they profile.
  static constexpr int64_t kProbeBytes = 256 << 10;
  int64_t probe_size() const { return kProbeBytes; }
  ThreadPool& pool() { return pool_; }
  const Clock& clock() const override { return *clock_; }
  // Upload admission (server/transport/upload_slots.h), used by the transport's upload calls.
  UploadSlots& uploads() { return uploads_; }
  // A refused upload, logged with the sender's identity (names escaped and bounded).
  void LogRefusedUpload(const v1::UploadHeader& h, const Status& why);
  int chunk_bytes() const { return opts_.config.server.chunk_bytes; }

  ParameterSet GlobalModel() const {
    MutexLock l(&mu_);
    return global_.weights;
  }
  int64_t committed_round() const {
    MutexLock l(&mu_);
    return global_.round;
  }
  std::vector<RoundMetrics> History() const {
    MutexLock l(&mu_);
    return log_.history();
  }
  std::string RunId() const {
    MutexLock l(&mu_);
    return log_.run_id();
  }
  std::pair<int64_t, int64_t> TransportBytes() const { return {traffic_.lifetime_up(), traffic_.lifetime_down()}; }
  // The operator's view (server/observe/observe.h), and the latencies the transport measures.
  // `history`: with every round's metrics (the dashboard), not only the last's.
  ObservedState Observe(bool history) const;
  // Server::ClientTaskSeconds.
  std::map<std::string, double> ClientTaskSeconds() const;
  struct TransportLatency {
    LatencyHistogram upload, fetch;
  };
  TransportLatency& latency() { return latency_; }
  Server::UploadCounts Uploads() const {
    const UploadSlots::Counts c = uploads_.counts();
    return {c.in_progress, c.waiting};
  }

 private:
  // --- RoundContext (server/rounds/round_context.h): what its schedulers and drivers may do.
  Mutex& mu() const override ABSL_LOCK_RETURNED(mu_) { return mu_; }
  const FederationConfig& config() const override { return opts_.config; }
  Strategy& strategy() override { return strategy_.get(); }
  const Codec* update_codec() const override { return codecs_.update.get(); }
  const ModelSpec& model_spec() const override { return model_.spec; }
  const std::vector<std::string>& frozen() const override { return model_.layout.frozen(); }
  const QuantizedSet& quantized_base() const override { return model_.quantized_base; }
  std::string RunPath(const std::string& name) const override { return opts_.run_dir.empty() ? "" : Path(name); }
  const std::string& RunIdLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return log_.run_id();
  }
  int64_t CurrentRoundLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return round_state().number;
  }
  int64_t CommittedRoundLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return global_.round;
  }
  bool StoppingLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; }
  void SetPhaseLocked(std::string phase) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    phase_ = std::move(phase);
  }
  std::mt19937_64& RngLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return rng_; }
  const RoundWeights& RoundWeightsLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return round_state().weights;
  }
  const FitSettings* EdgeFitLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return edge_ ? &edge_->fit : nullptr;
  }
  const ParameterSet& UpdateLayoutLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return UpdateLayout();
  }
  const ParameterSet& GlobalLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return global_.weights;
  }
  std::vector<std::string> AvailableLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Session* FindSessionLocked(const std::string& client_id) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TaskMap& TasksLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return round_state().tasks; }
  void FailTaskLocked(const std::string& task_id, TaskRecord& t, const std::string& why) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RoundResolvedLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int AccumulatingLocked() const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return round_state().accumulating;
  }
  Status AwaitClientsLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BeginRoundLocked(int64_t round, const std::vector<std::string>& clients,
                        RoundHooks& driver, bool evaluate_only) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BeginBufferLocked(int64_t version, RoundHooks& driver) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The weights of updates from `clients` (aggregation.weighting and its caps over their
  // counts).
  RoundWeights WeightsOfLocked(const std::vector<std::string>& clients) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendTasksLocked(int64_t round, const std::vector<std::string>& cids,
                       const RoundPlan& plan, int64_t deadline_ms) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WaitLocked(Clock::time_point until) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AwaitChangeLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { cv_.Wait(&mu_); }
  void Wake() override { cv_.SignalAll(); }
  void AwaitAccumulatingLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndRoundLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseUploadsLocked() override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountRoundBytesLocked(RoundMetrics* m) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Accumulate(const ClientUpdate& update) override;
  Status FlTrustReference(const FitSettings& fit) override;
  Status ApplyLocked(int64_t round,
                     const std::function<Status(const ParameterSet& layout)>& fold,
                     RoundMetrics* m) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitWithoutModelLocked(int64_t round) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    global_.round = round;
  }
  std::string ModelBlob(const ParameterSet& model) override;
  void PinBlobLocked(const std::string& digest, std::shared_ptr<const std::string> blob) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddBlobLocked(const std::string& digest, std::shared_ptr<const std::string> blob,
                     int64_t fp32_size) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // A Join message on its own: protocol, sizes, printable names, the certificate's
  // identity under mutual TLS, and the codecs this run needs.
  Status CheckJoin(const v1::Join& join, const std::string& peer) const;
  // What its schedulers and drivers are given.
  RoundContext& context() { return *this; }

  // --- Its own.
  int ConnectedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends session `id`: its open tasks fail with `why`, the round's driver, the mode's
  // driver and the scheduler forget it. Returns its control stream, which the caller
  // closes without mu_.
  std::shared_ptr<ClientLink> EndSessionLocked(const std::string& id, const std::string& why)
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
  // The mode's driver wants a Profile of every client before it takes part.
  bool NeedProfile() const { return machinery_.mode().NeedsProfile(); }
  // Encodes global_.weights and makes it the model version clients fetch.
  void PublishModelLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked(std::shared_ptr<const std::string> blob, std::string digest)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops clients silent past server.client_timeout_s, and cancels uploads that made no
  // progress for server.upload_idle_timeout_s while they could (failing their task, so a
  // stalling client holds an upload slot at most once per round). Releases mu_ while
  // closing streams.
  void ExpireSilentLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An upload ProcessUpload claimed under mu_, for the work without it. The round stays
  // open while its task is kAccumulating (schedulers wait for round_state().accumulating to reach 0
  // before they close it), so the layout (global_, the update layout or a split part) and
  // the strategy's round do not change meanwhile.
  struct ClaimedUpload {
    bool resolved = false;  // a duplicate, or accepted under the lock: nothing more to do
    const ParameterSet* layout = nullptr;
    float scale = 1.0f;           // the scheduler's factor (async: staleness)
    RoundHooks::AddUpload add;    // the driver's, when it adds the update itself
    ClientUpdate update;          // otherwise what the strategy accumulates
    std::optional<BufferEntry> record;  // what the scheduler records of it
    // server.record_updates: where the update goes with the model it started from.
    std::string update_record_path;
    ParameterSet update_record_base;
  };
  // Checks upload `h` against its task again and claims it (kAccumulating), or resolves
  // it at once (a duplicate, a masked input, an evaluation).
  StatusOr<ClaimedUpload> ClaimUploadLocked(const v1::UploadHeader& h, const std::string& payload,
                                            bool* duplicate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // server.record_updates: writes the claimed update (its checked values, before any
  // scaling) with the model it started from; a failure is logged, the upload goes on.
  void RecordUpdate(const ClaimedUpload& claim, const std::vector<TensorView>& views);
  // Validates a claimed upload's values (`views`, or its encoding) and adds them.
  Status AddClaimed(const v1::UploadHeader& h, const std::string& payload,
                    std::vector<TensorView> views, ClaimedUpload& claim);
  // Marks `t` done with upload `h`'s report (bytes, loss, weight, evaluation).
  void AcceptLocked(TaskRecord& t, const v1::UploadHeader& h, int64_t weight,
                    size_t payload_size, const ParameterSet& layout)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResetRoundBytes();
  Status Commit(RoundMetrics* m);
  // After the last round: the final model's federated evaluation, when clients hold
  // data out (server.final_evaluation). Appended to metrics.jsonl; never fails the run.
  void FinalEvaluation(double elapsed_s);
  // Init's steps. The model: built, its starting weights, the TorchScript archive and loss as pinned
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
  // The serialized checkpoint of the last committed round.
  std::string CheckpointLocked(double elapsed_s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tells every client the run ended (RunEnded): they exit.
  void EndRun(const std::string& reason);
  // Closes every control stream with UNAVAILABLE: clients reconnect (server stopped).
  void DisconnectClients();
  std::string Path(const std::string& name) const {
    return (std::filesystem::path(opts_.run_dir) / name).string();
  }

  // The layout of an update (and of the strategy's sums).
  const ParameterSet& UpdateLayout() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return model_.UpdateLayout(global_.weights);
  }
  // What a round's model blob and a checkpoint hold (ModelLayout::Published).
  const ParameterSet& Published(const ParameterSet& model, ParameterSet& scratch) const {
    return model_.layout.Published(model, scratch);
  }
  // The Run thread is the only writer of global_ (under mu_), so it may read it without.
  const ParameterSet& RunThreadGlobal() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return global_.weights;
  }

  const ServerOptions opts_;  // config() is opts_.config

  // The server's own evaluation (Run thread): the model, data.test, and
  // aggregation.root_data (FLTrust; empty otherwise).
  struct Evaluation {
    std::unique_ptr<Model> model;
    Dataset test, root;
  } eval_;
  // The strategy, its round's partial sums one per upload worker.
  ShardedStrategy strategy_;
  // The model's description, layout and quantized base (fixed by Init). Checkpoints hold
  // the published tensors: a frozen base follows from the config (seed, model.weights).
  ModelState model_;
  // What every task names besides its round's model (fixed by Init).
  TaskAssets assets_;
  struct Codecs {
    std::unique_ptr<Codec> update;     // compression.update, unless none (decoding only)
    std::unique_ptr<Codec> broadcast;  // compression.broadcast, unless none; one thread at
                                       // a time (start, round end)
  } codecs_;

  // How rounds run (fixed by Init): the job's kind of round, its scheduler, the
  // synchronous rounds of the final evaluation; and the round in progress, under mu_.
  RoundMachinery machinery_{context()};
  // The round in progress: the machinery's, guarded by its context's mutex, which is
  // mu_ (machinery_ was built over this coordinator).
  CurrentRound& round_state() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    machinery_.mu().AssertHeld();
    return machinery_.round();
  }
  const CurrentRound& round_state() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    machinery_.mu().AssertHeld();
    return machinery_.round();
  }

  // Time for every deadline and timeout (ServerOptions::clock; the real one by default).
  const std::shared_ptr<Clock> clock_;
  // How often waits wake to expire silent clients and stalled uploads.
  static constexpr Clock::duration kPoll = std::chrono::milliseconds(200);

  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string phase_ ABSL_GUARDED_BY(mu_) = "starting";
  std::unique_ptr<RunFiles> run_files_;  // metrics.jsonl and checkpoint.pb (with a run dir)
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);  // client sampling, gossip graphs (checkpointed)
  SessionTable sessions_ ABSL_GUARDED_BY(mu_);
  BlobStore blobs_ ABSL_GUARDED_BY(mu_);
  CommittedModel global_ ABSL_GUARDED_BY(mu_);
  RunLog log_ ABSL_GUARDED_BY(mu_);  // the run's id and the rounds recorded
  TrafficMeter traffic_;
  TransportLatency latency_;
  // An edge round's settings and batch seed, from the upstream task (RunEdgeRound).
  struct EdgeTask {
    FitSettings fit;
    uint64_t seed = 0;
  };
  std::optional<EdgeTask> edge_ ABSL_GUARDED_BY(mu_);
  BufferPool buffers_;
  UploadSlots uploads_;
  // The round's update noise (ServerOptions::measure_update_noise, where the job allows
  // it); null otherwise.
  const std::unique_ptr<UpdateNoiseMeter> noise_;

  ThreadPool pool_;  // last member: its workers finish before the state above dies
};


}  // namespace cleave
