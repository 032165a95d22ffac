// Internal to client/: the client's state and its parts (Client::Impl). client.cc holds
// the session loop (join, heartbeats, the control stream); client/tasks/ the task
// handlers, one file per task kind (handlers.cc picks one); model_cache.h the model kept
// across tasks (ModelCache); uploader.cc the uploads; attack.cc a simulated attacker's
// update.
#pragma once

#include "client/client.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/attacks.h"
#include "client/emulation.h"
#include "client/gossip.h"
#include "client/model_cache.h"
#include "client/secagg_client.h"
#include "client/shared.h"
#include "client/split_client.h"
#include "client/transfer.h"
#include "client/uploader.h"
#include "compression/codec.h"
#include "core/clock.h"
#include "core/files.h"
#include "core/mutex.h"
#include "core/parameter_set.h"
#include "core/printable.h"
#include "models/hf_folder.h"
#include "models/model.h"
#include "privacy/tls.h"

namespace cleave {


struct Client::Impl {
  // Errors after which retrying cannot help: the run ends.
  static bool Fatal(absl::StatusCode c) { return RetryCannotHelp(c); }
  // Tells the server `task` was not taken, with the reason, and returns `why`.
  static Status Decline(const std::function<void(const v1::TaskAck&)>& ack, const v1::Task& task,
                        const Status& why) {
    v1::TaskAck a;
    a.set_task_id(task.task_id());
    a.set_accepted(false);
    a.set_error(std::string(why.message()));
    a.set_code(static_cast<int32_t>(why.code()));
    ack(a);
    return why;
  }

  explicit Impl(ClientOptions o)
      : opts(std::move(o)),
        clock(opts.clock ? opts.clock : Clock::Real()),
        jitter_rng(std::random_device{}()),
        emulator(opts.emulation.uplink_mbps, opts.emulation.downlink_mbps,
                 opts.emulation.slowdown),
        models(opts, &emulator),
        uploader(opts, &emulator) {}

  ClientOptions opts;
  // Reconnect backoff, giving up and heartbeats wait on it (ClientOptions::clock); the
  // times a client measures and reports (training, transfers) stay on the steady clock.
  const std::shared_ptr<Clock> clock;
  std::mt19937_64 jitter_rng;
  std::atomic<bool> stop{false};
  std::atomic<int> tasks_done{0};
  // --split-guard: the guard over this client's split tasks, made with the first; once
  // it caught the server hijacking training (its PERMISSION_DENIED), every later split
  // task is declined with that. Used on the task's thread.
  std::unique_ptr<SplitGuard> split_guard;
  Status hijack_suspected;
  // An edge aggregator whose clients now hold more examples than it declared at Join:
  // the total to declare when it joins again (0: none).
  std::atomic<int64_t> grown_examples{0};
  DeviceEmulator emulator;
  // What State() reports besides the counters above (bytes: the emulator's buckets).
  mutable Mutex state_mu;
  ClientState state ABSL_GUARDED_BY(state_mu);
  template <typename F>
  void UpdateState(F f) {
    MutexLock l(&state_mu);
    f(state);
  }
  void RecordTraining(const TrainStats& t) {
    UpdateState([&](ClientState& st) {
      st.train_seconds = t.seconds;
      st.train_loss = t.loss;
    });
  }

  Mutex mu;  // guards ctx and the sleep below
  CondVar cv;
  grpc::ClientContext* ctx = nullptr;

  // The model kept across tasks, its bases and this device's personal layers.
  ModelCache models;
  // Updates encoded and uploaded; --keep-sent's copies.
  Uploader uploader;

  // Outcome of one connection.
  enum class End { kRunEnded, kRetry, kFatal, kCrashed, kStopped };

  Status Run();
  // One connection: Join, then the control stream's tasks until it ends.
  End Session(bool* joined, Status* why);
  // The control stream of a session: writes from any thread (heartbeats, acks, tasks),
  // reads by the session's thread, and a message read on a task's behalf that belongs to
  // what comes after it.
  struct ControlStream {
    std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream;
    Mutex write_mu;
    std::optional<v1::ServerMessage> pending;
    // True once a read failed: the server ended the stream, and Finish returns its
    // status (cancelling first would replace the server's reason by CANCELLED).
    bool server_ended = false;
    bool Write(const v1::ClientMessage& m) {
      MutexLock l(&write_mu);
      return stream->Write(m);
    }
    bool Read(v1::ServerMessage* m) {
      if (!pending) return !(server_ended = !stream->Read(m));
      *m = *std::move(pending);
      pending.reset();
      return true;
    }
  };
  // The Join this client sends: its name, device, codecs, declared examples, Peer address.
  v1::ClientMessage JoinMessage() const;
  // After the Welcome, with split learning's cut: auto: this device's profile for the
  // cut policy, sent on the stream. An error ends the session.
  Status SendProfile(v1::Coordinator::Stub* stub, const v1::Welcome& welcome, ControlStream& cs);
  // The session's task loop: each task to HandleTask, until the run ends, the stream
  // closes, a task crashes (test hook), or an edge must join again (*rejoin) because it
  // now holds more than the `declared` examples.
  End ServeTasks(v1::Coordinator::Stub* stub, const v1::Welcome& welcome, ControlStream& cs,
                 grpc::ClientContext& ctx, int64_t declared, bool* rejoin);
  // `next` reads the task's later control messages (secure aggregation).
  // Replaces the honest `delta` (trained from `global` with `o`) by the attack's update.
  Status Attack(const ParameterSet& global, const LocalTrainOptions& o, ParameterSet* delta);
  // What Join declares, and an edge claims at most: declared_examples (or the total an
  // edge's clients grew to since), else train.size.
  int64_t DeclaredExamples() const {
    if (opts.declared_examples <= 0) return opts.train.size;
    return std::max(opts.declared_examples, grown_examples.load());
  }
  // Runs `task` with the handler of its kind (TaskHandlers below).
  Status HandleTask(v1::Coordinator::Stub* stub, const v1::Welcome& w, const v1::Task& task,
                    const std::function<void(const v1::TaskAck&)>& ack,
                    const NextMessage& next, bool* crashed);
  // What a task handler is given: the session's stub and welcome, the task, how to
  // acknowledge it, the control stream's next message (secure aggregation's stages) and
  // where to say that a test hook simulated a crash.
  struct TaskCall {
    v1::Coordinator::Stub* stub;
    const v1::Welcome& w;
    const v1::Task& task;
    const std::function<void(const v1::TaskAck&)>& ack;
    const NextMessage& next;
    bool* crashed;
    // Declines the task with `why` and returns it.
    Status Reject(const Status& why) const { return Decline(ack, task, why); }
    // Tells the server the task is taken.
    void Accept() const {
      v1::TaskAck a;
      a.set_task_id(task.task_id());
      a.set_accepted(true);
      ack(a);
    }
  };
  // One handler per task kind; HandleTask runs the first whose kind matches.
  struct TaskHandler {
    const char* kind;
    bool (*matches)(const ClientOptions& o, const v1::Task& t);
    Status (Impl::*run)(const TaskCall& c);
  };
  static const std::vector<TaskHandler>& TaskHandlers();
  // A task of an edge aggregator (ClientOptions::aggregate): every task it gets.
  Status HandleEdgeTask(const TaskCall& c);
  // opts.external: the caller's code trains and evaluates (HandleExternalSplitTask: its
  // stages of a split model).
  Status HandleExternalTask(const TaskCall& c);
  Status HandleExternalSplitTask(const TaskCall& c);
  StatusOr<v1::ClientEvaluation> EvaluateExternal(const v1::Task& task, const ClientOptions::External::Global& global);
  // A whole-model task's trained `delta`: masked under secure aggregation (with its DP
  // noise share), else uploaded with `evaluation`.
  StatusOr<v1::UploadReply> UploadTrained(const TaskCall& c, std::optional<SecAggClient>& secagg, ParameterSet delta,
                                          const TrainStats& stats, const v1::ClientEvaluation* evaluation);
  // The final evaluation's upload (an empty update carrying it), declaring `examples`.
  Status UploadFinalEvaluation(const TaskCall& c, const v1::ClientEvaluation& evaluation, int64_t examples);
  // A split-learning task: the client part trained against the server.
  Status HandleSplitTask(const TaskCall& c);
  // How this device runs `task`'s part of `spec` (RunSplitTask, RunPipelineRelay).
  SplitTaskOptions SplitOptions(const v1::Task& task, const v1::Welcome& w, const ModelSpec& spec);
  // The final evaluation (Task.evaluate_only): the global model on the held-out data.
  Status HandleEvaluationTask(const TaskCall& c);
  // A whole-model federated task: train, then upload the update (masked under SecAgg+).
  Status HandleTrainingTask(const TaskCall& c);
  // Gossip rounds: the Peer service (when opts.peer_listen is set), the address Join
  // announces, and the model this client holds across rounds (of run gossip_run).
  std::unique_ptr<PeerServer> peer;
  std::string peer_address;
  mutable Mutex gossip_mu;  // for GossipModel(), from other threads
  ParameterSet gossip_model ABSL_GUARDED_BY(gossip_mu);
  std::string gossip_run ABSL_GUARDED_BY(gossip_mu);
  // Federated evaluation: `model` as it is, on the held-out data, under `loss`.
  StatusOr<v1::ClientEvaluation> EvaluateHoldout(const std::string& loss);
  // A gossip task: train the model held, exchange it with the neighbours, average.
  Status HandleGossipTask(const TaskCall& c);
  // Before a gossip task is taken: the model built and set to the one this client holds
  // (fetched the first time), the task's rule and memory checked; an error declines it.
  StatusOr<ParameterSet> GossipHeldModel(const TaskCall& c, const std::string& loss);
  // What this client sends its neighbours: `trained`, or a simulated attacker's model.
  StatusOr<ParameterSet> GossipSent(const ParameterSet& held, const ParameterSet& trained,
                                    const LocalTrainOptions& o);
  // Sends `mine` to every neighbour of the gossip task while theirs arrive, until the
  // task's deadline; the models heard, and what the exchange measured in *report
  // (neighbours, heard, bytes each way, the uplink the sends used).
  std::map<std::string, ParameterSet> ExchangeModels(const TaskCall& c,
                                                     const ParameterSet& mine,
                                                     v1::GossipStats* report);
  // Waits `seconds` on the clock, or until stopped.
  void Sleep(double seconds) {
    MutexLock l(&mu);
    const Clock::time_point until = clock->Now() + Seconds(seconds);
    while (!stop && clock->Now() < until) clock->WaitUntil(cv, mu, until);
  }
};

// Shared by the task handlers.
// Batch order: the round's seed mixed with this client's name (stable across runs,
// unlike the id the server assigns in join order), so a seeded run repeats itself.
uint64_t BatchSeed(const v1::Task& task, const v1::Welcome& w, const std::string& name);
// trained - base, tensor by tensor (the same layout).
ParameterSet Delta(ParameterSet trained, const ParameterSet& base);

}  // namespace cleave
