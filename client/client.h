// The edge runtime: dials the server, joins, trains on local data when given a task and
// uploads the update (local model minus global model). Reconnects with exponential
// backoff and jitter while the server is unreachable; returns when the run ends.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "core/clock.h"
#include "core/device_trace.h"
#include "core/parameter_set.h"
#include "core/status.h"
#include "data/dataset.h"
#include "privacy/split_guard.h"

namespace cleave::v1 {
class DeviceProfile;  // cleave.pb.h, kept out of this header
class Task;
}  // namespace cleave::v1

namespace grpc {
class Channel;
}  // namespace grpc

namespace cleave {

class Heartbeats;
class TaskSlots;

struct ExternalSplit;  // client/split_client.h

struct ClientOptions {
  std::string server;              // host:port
  // A channel to use instead of dialing `server` (then only named in logs): e.g.
  // Server::InProcessChannel(), for clients that run inside the server's process. TLS
  // options do not apply to it.
  std::shared_ptr<grpc::Channel> channel;
  // Simulations (client/shared.h): tasks (fetch, train, upload) run on these shared
  // workers instead of the client's thread, so that a process hosting thousands of
  // clients holds the training state of only a few; and the heartbeats of all its
  // clients go out from one thread. A client with task slots also builds its model for
  // each task and drops it after. Null = the client's own threads.
  std::shared_ptr<TaskSlots> task_slots;
  std::shared_ptr<Heartbeats> heartbeats;
  std::string name;                // shown in the server's logs
  Dataset train;                   // local training data
  // Held-out local data (cleave-client --holdout): each whole-model task first measures
  // the global model on it and reports that with the update (federated evaluation).
  // Empty = none. Not with secure aggregation (one client's numbers would show).
  Dataset holdout;
  // Where this device keeps its personal layers (model.personal) across restarts
  // (cleave-client --state-dir): DIR/personal.pb, tied to the run and the model. Empty =
  // in memory only: a restarted client starts them again from the initial values.
  std::string state_dir;
  // A privacy measurement (cleave-client --keep-sent N): the device keeps, in
  // STATE_DIR/sent/round-R/CLIENT_ID.pb, the inputs and labels of each split task's
  // first N micro-batches, or of a whole-model task's first batch (split/record.h), the
  // truth the server's recorded attacks (split.record, server.record_updates) are
  // scored against. Nothing more is sent. 0 = none.
  int keep_sent = 0;
  // SplitGuard (cleave-client --split-guard, privacy/split_guard.h): in sl and sfl split
  // tasks the device sends fake micro-batches now and then and checks that the server's
  // gradients depend on the labels; when they do not (training hijacking), the task fails
  // with PERMISSION_DENIED and the device refuses the server's later split tasks.
  SplitGuardOptions split_guard;
  // A local copy of the model's Hugging Face folder (cleave-client --model-dir), for
  // split tasks of model hf with LoRA: the frozen tensors of this device's stages are
  // read from it into the part (only the shards that hold them), instead of fetched
  // from the server and held beside it, and checked against the task's base digest.
  std::string model_dir;
  double initial_backoff_s = 0.5;  // first reconnect delay; doubles up to max_backoff_s
  double max_backoff_s = 30;
  double give_up_after_s = 600;    // unreachable this long: Run() returns UNAVAILABLE
  // Time for the reconnect backoff, giving up and the heartbeat period; null = the real
  // clock. Tests pass a FakeClock (core/clock.h) and move it by hand.
  std::shared_ptr<Clock> clock;
  // A long-lived client's daily limits (service/pool_member.h): `may_train` is asked
  // before each task that trains (an error declines the task with it), and `trained` is
  // told the wall seconds of each one that ended well.
  std::function<Status()> may_train;
  std::function<void(double seconds)> trained;
  // Test hook, called after local training: return true to simulate a crash (the
  // connection is dropped without an upload and Run() returns ABORTED).
  std::function<bool(int64_t round)> crash_after_training;
  // Test hook for split tasks, called after each step: true simulates a crash mid-task.
  std::function<bool(int64_t round, int64_t step)> crash_after_split_step;

  // Device emulation (cleave-client --emulate-*) and the memory this device lends to
  // training, declared to the server's cut policy (0 = no limit).
  DeviceEmulation emulation;
  int64_t memory_limit_bytes = 0;
  // Whether what the process holds counts against memory_limit_bytes (false: clients
  // sharing one process, as `cleave simulate`'s, budget their training alone).
  bool count_resident = true;

  // TLS (cleave-client --ca --cert --key): the federation CA to verify the server with,
  // and this client's certificate and key for mutual TLS (its CN is its identity).
  std::string tls_ca, tls_cert, tls_key;
  // Plaintext instead (cleave-client --insecure); without it Run() refuses an empty tls_ca.
  bool insecure = false;
  // Bearer token sent on every call (auth.token_file on the server); needs TLS.
  std::string token;

  // Attack simulation for robustness experiments (cleave-client --attack): what this
  // client sends instead of its honest update. Empty = honest. See AttackNames() (client/attacks.h).
  std::string attack;

  // Edge aggregation (cleave-server --upstream, edge/edge.h): a task's work is done by
  // `aggregate` instead of local training. It gets the task and its model and returns
  // the update (a delta from that model), its weight and its loss. Whole-model federated
  // tasks only: split, secure-aggregation, DP-share, evaluation and personal- or
  // frozen-tensor tasks are declined with the reason.
  struct Aggregate {
    ParameterSet delta;
    int64_t examples = 0;
    double loss = 0;
    // Under an upstream with width-scaled submodels: each element's weight (the examples
    // of the devices below that hold it), in the delta's layout; uploaded after it.
    ParameterSet weights;
  };
  std::function<StatusOr<Aggregate>(const v1::Task& task, const ParameterSet& model)> aggregate;
  // The example count declared at Join (0 = train.size); uploads claim at most this.
  int64_t declared_examples = 0;
  // No count declared at Join (Join.count_from_fit): each training upload reports what
  // `external.fit` returned, as Flower's fit does. Not with secure aggregation.
  bool count_from_fit = false;

  // Training and evaluation in the caller's own code (the Python package's clients,
  // python/): a whole-model federated task's global model goes to `fit`, whose trained
  // parameters become the update, and (when set) to `evaluate` first, for federated
  // evaluation; an evaluation-only task goes to `evaluate` alone. Everything on the wire
  // stays this client's: TLS, codecs with error feedback, secure aggregation, DP
  // clipping, heartbeats, reconnects. Split, gossip, submodel, frozen-base and
  // personal-layer tasks are declined with the reason. An error, or parameters not of
  // the model's tensors and shapes or not finite, fails the task with that message.
  struct ExternalFit {
    // The trained tensors, in the model's order: views of the caller's memory (raw
    // float32), read in place, and whatever keeps that memory alive until they are read.
    std::vector<TensorView> parameters;
    std::shared_ptr<const void> keep;
    int64_t examples = 0;
    double loss = 0;  // metrics["loss"] when the caller reports one
  };
  struct ExternalEvaluation {
    int64_t examples = 0;
    double loss = 0;
    double accuracy = 0;  // metrics["accuracy"] when the caller reports one
    std::map<std::string, double> metrics;
  };
  struct External {
    // `global` is shared so that the caller may view it without a copy while it needs it.
    using Global = std::shared_ptr<const ParameterSet>;
    std::function<StatusOr<ExternalFit>(const v1::Task& task, const Global& global)> fit;
    std::function<StatusOr<ExternalEvaluation>(const v1::Task& task, const Global& global)> evaluate;
    // Split tasks (sl, sfl-v1, sfl-v2 at a fixed split.cut): the device's stages in the
    // caller's code (client/split_client.h).
    std::shared_ptr<const ExternalSplit> split;
  };
  External external;

  // Decentralised rounds (scheduler.mode: gossip; cleave-client --peer-listen): where
  // this client serves the Peer service its neighbours send their models to (host:port,
  // port 0 picks one), over mutual TLS with its certificate when it has one. Empty = it
  // serves none and takes no part in gossip rounds. peer_advertise: the address its
  // neighbours dial (default: peer_listen's host with the bound port).
  std::string peer_listen;
  std::string peer_advertise;
};

// What a device's operator sees of its client (Client::State; cleave-client
// --metrics-listen serves it as Prometheus text, ClientMetricsText).
struct ClientState {
  bool connected = false;  // in a run: joined, its control stream open
  std::string run_id, client_id;  // of the last run joined
  int64_t round = 0;       // of the last task received
  int64_t tasks_done = 0, tasks_failed = 0;  // failed: declined or failed after accepting
  int64_t bytes_sent = 0, bytes_received = 0;  // every message's bytes, either way
  double train_seconds = 0, train_loss = 0;    // of the last local training
  int64_t examples = 0;    // its training examples
  double gossip_uplink_mbps = 0;  // measured by its last gossip sends (0: none)
};

// The Prometheus text exposition of `s` (metric names cleave_device_*).
std::string ClientMetricsText(const ClientState& s);

// What this device declares at Join: its host name, cores, physical memory, platform.
v1::DeviceProfile LocalDevice();

// Whether a server's refusal with code `c` is one retrying cannot change (a bad
// argument, a failed precondition, no or the wrong credentials, a call the server does
// not serve): a client gives up at once.
inline bool RetryCannotHelp(absl::StatusCode c) {
  return c == absl::StatusCode::kInvalidArgument || c == absl::StatusCode::kFailedPrecondition ||
         c == absl::StatusCode::kUnauthenticated || c == absl::StatusCode::kPermissionDenied ||
         c == absl::StatusCode::kUnimplemented;
}

class Client {
 public:
  explicit Client(ClientOptions options);
  ~Client();

  // Runs until the server ends the run (OK), Stop() (CANCELLED), a fatal rejection
  // (the server's status), or give_up_after_s without reaching the server (UNAVAILABLE).
  Status Run();
  // Thread-safe; makes Run() return soon.
  void Stop();

  int tasks_completed() const;
  // Thread-safe.
  ClientState State() const;
  // The model this client holds in gossip rounds (empty before its first).
  ParameterSet GossipModel() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cleave
