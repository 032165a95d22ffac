// The coordinator: accepts clients on a gRPC port, runs training rounds, aggregates
// updates with a Strategy, evaluates the global model and keeps the run directory.
//
// Lifecycle: Create() validates options and loads the model and test data; Start()
// binds the port (port 0 picks a free one) and serves; Run() drives the rounds until
// the run ends, then tells clients the run ended (they exit), or until Stop() is called,
// then closes their streams as UNAVAILABLE (they reconnect, to a restarted server).
// Stop() may be called from any thread (e.g. a signal handler thread). Other methods
// are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "aggregation/strategy.h"
#include "core/clock.h"
#include "core/parameter_set.h"
#include "core/status.h"
#include "server/options.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace cleave {

struct RoundMetrics;  // below

struct ServerOptions {
  FederationConfig config;
  // Address to listen on; empty = config.server.listen.
  std::string listen;
  // Open no port: clients reach the server only through InProcessChannel() (simulations,
  // tests without sockets). TLS, bearer tokens and descriptor limits do not apply.
  bool in_process_only = false;
  // Run directory (config copy, metrics.jsonl, checkpoint). Empty = keep nothing on disk.
  std::string run_dir;
  // The job config's text, copied to run_dir/config.yaml.
  std::string config_text;
  // Serve plaintext when config.tls has no certificate (cleave-server --insecure).
  // Otherwise a config without tls.cert is refused.
  bool insecure = false;
  // Evaluate the global model on data.test after each round.
  bool evaluate = true;
  // Replaces the model's initial parameters (tests and benchmarks with models larger
  // than the zoo's). Requires evaluate = false unless the layout matches the model.
  std::optional<ParameterSet> initial_model;
  // Time for every deadline and timeout (rounds, joins, heartbeats, idle uploads, SecAgg
  // stages, TLS reloads); null = the real clock. Tests pass a FakeClock.
  std::shared_ptr<Clock> clock;
  // A strategy of the caller's own instead of the one config.strategy names (a library
  // user's algorithm; its refusals and settings are its own). Called once, by Create.
  std::function<StatusOr<std::unique_ptr<Strategy>>(const StrategyJob&)> strategy;
  // Called on the Run thread after each round is committed and checkpointed (the daemon
  // times rounds with it to forecast a job's end).
  std::function<void(const RoundMetrics&)> committed;
  // Measure each round's update noise (RoundMetrics::update_noise) where the job's step
  // allows it (server/observe/update_noise.h): the daemon's goodput scheduler reads it.
  bool measure_update_noise = false;
  // Test hook: called by each federated upload after the checks it passes under the
  // coordinator's lock, before it is validated and added without the lock.
  std::function<void()> before_accumulate;
};

// Split learning (split.mode set): what crossed the cut, the cut of each client (by
// name), and the mean step time of the participants split into its parts.
struct SplitMetrics {
  int64_t activation_bytes_up = 0;   // activations, labels and (U-shaped) gradients up
  int64_t gradient_bytes_down = 0;   // gradients and (U-shaped) activations down
  int64_t labels_up = 0;             // labels the server received
  std::map<std::string, int> cuts;
  double step_s = 0;
  double client_compute_s = 0;
  double transfer_s = 0;
  double server_compute_s = 0;
  // The share of the round the server's parts computed (SplitRound::ServerLoad: busy
  // seconds / span); with several clients the server computes while others transfer.
  double server_busy = 0;
  // split.mode: pipeline: each chain of the round.
  struct Chain {
    std::vector<std::string> devices;  // by name, the data owner first
    std::vector<int> bounds;           // devices[i] held [bounds[i], bounds[i + 1]); the server the rest
    bool done = false;                 // every device's task finished
    std::vector<double> busy;          // per device: its compute over its task's wall time
    double bubble = 0;                 // 1 - the devices' mean busy share
    // Each device's passes over its first batch (PipelineSpan; seconds from the chain's
    // first), for the timeline cleave report draws.
    struct Span {
      int device = 0, micro_batch = 0;
      bool forward = true;
      double start_s = 0, end_s = 0;
    };
    std::vector<Span> spans;
  };
  std::vector<Chain> chains;
};

// Decentralised rounds (scheduler.mode: gossip): what the clients reported of their
// exchange. The mean squared distance between neighbouring models after local
// training, over the edges heard (the models' spread: 0 when they agree), the model
// bytes that went between peers, the neighbours heard against those named, and of the
// heard those whose models scheduler.gossip_rule: clipped shortened.
struct GossipMetrics {
  double disagreement = 0;
  int64_t peer_bytes = 0;
  int neighbours = 0, heard = 0, clipped = 0;
};

// scheduler.mode: async: the buffer's updates by staleness (versions applied since the
// one each trained from) and count, and the local steps they were given
// (scheduler.target_staleness sizes them per client): their mean, min and max.
struct AsyncMetrics {
  std::map<int64_t, int> staleness;
  double local_steps_mean = 0;
  int64_t local_steps_min = 0, local_steps_max = 0;
};

// What one committed round produced; also one line of metrics.jsonl.
// A round's client updates as noise around their expected update
// (server/observe/update_noise.h): the noise's variance sigma^2 and the expected
// update's squared norm |G|^2, both estimates (either may come out negative).
struct UpdateNoise {
  double noise = 0;
  double signal = 0;
};

struct RoundMetrics {
  int64_t round = 0;
  // The final evaluation: clients measured the model of `round` (already committed);
  // nothing was trained or aggregated.
  bool evaluation_only = false;
  bool evaluated = false;  // on data.test by the server (server.evaluate)
  double test_accuracy = 0;
  double test_loss = 0;
  std::map<std::string, double> test_metrics;  // EvalStats::metrics
  std::vector<double> test_per_class_accuracy;
  double train_loss = 0;
  int participants = 0;
  int failures = 0;
  // Bytes that crossed the transport this round (WireSize: protobuf, gRPC and HTTP/2
  // framing, per-call headers), and what they would have been with every payload fp32.
  int64_t bytes_up = 0;
  int64_t bytes_down = 0;
  int64_t bytes_up_fp32 = 0;
  int64_t bytes_down_fp32 = 0;
  // The accepted uploads' payloads alone (what the update codec produced): no headers,
  // heartbeats or split streams, so it does not grow with the round's wall time.
  int64_t update_bytes = 0;
  double wall_s = 0;
  double elapsed_s = 0;
  // Federated evaluation: the round's global model measured by the participants on
  // their held-out data (cleave-client --holdout), before they trained on it. Accuracy
  // and loss are weighted by examples; min/median/max are over clients.
  using ClientEvaluations = EvaluationSummary;  // Strategy::AggregateEvaluation
  ClientEvaluations client_eval;
  // What the strategy adds (DP: epsilon, delta, dp_clip, dp_noise_std, ...).
  std::map<std::string, double> strategy_stats;
  // What the round's kind of round and scheduler add, each written by its own part:
  // SplitDriver (split.mode set), GossipDriver (scheduler.mode: gossip), AsyncBuffers
  // (scheduler.mode: async; `round` is then the model version the buffer made).
  std::optional<SplitMetrics> split;
  std::optional<GossipMetrics> gossip;
  std::optional<AsyncMetrics> async;
  // WidthDriver (section width): the rate each participant trained at, by name.
  std::map<std::string, double> widths;
  int64_t examples = 0;  // the accepted updates' weights, summed
  std::optional<UpdateNoise> update_noise;  // ServerOptions::measure_update_noise
};

// What an edge aggregator's round hands upstream (Server::RunEdgeRound).
struct EdgeRound {
  ParameterSet delta;    // the participants' weighted mean update
  int64_t examples = 0;  // their weights, summed
  RoundMetrics metrics;
  // Width-scaled submodels: each element's weight, the examples of the participants that
  // held it (RoundDriver::ElementWeights); empty otherwise.
  ParameterSet weights;
};

class Server {
 public:
  static StatusOr<std::unique_ptr<Server>> Create(ServerOptions options);
  ~Server();

  // Binds and starts serving. Afterwards port() is the bound port.
  Status Start();
  int port() const;
  // The operator's endpoint's port (server.metrics_listen), 0 when off.
  int metrics_port() const;
  // A channel to this server that uses no socket, for clients in this process
  // (ClientOptions::channel). After Start().
  std::shared_ptr<grpc::Channel> InProcessChannel();

  // Runs rounds until config.run.rounds rounds have committed (OK), Stop() is called
  // (CANCELLED), or the run cannot go on (e.g. too few clients joined in time).
  Status Run();
  void Stop();

  // The current global model and last committed round (0 before the first).
  ParameterSet GlobalModel() const;
  int64_t committed_round() const;
  std::vector<RoundMetrics> History() const;
  // Each connected client's last accepted task's training time in seconds, by name
  // (clients without one left out).
  std::map<std::string, double> ClientTaskSeconds() const;
  // Transport bytes counted since start, up and down (the sums behind bytes_up and
  // bytes_down, including traffic outside rounds).
  std::pair<int64_t, int64_t> TransportBytes() const;
  // Uploads whose header was accepted and that have not ended, and how many of them wait
  // for an upload slot (server.worker_threads).
  struct UploadCounts {
    int in_progress = 0;
    int queued = 0;
  };
  UploadCounts Uploads() const;

  // Edge aggregation (edge/edge.h), instead of Run(). WaitForClients waits for
  // clients.min connected clients (DEADLINE_EXCEEDED after clients.join_timeout_s) and
  // returns the examples they declared, summed. RunEdgeRound runs one synchronous round
  // of this server's clients from `start` (an upstream model of this server's layout),
  // training with `fit` and batch seed `seed`, commits it here (metrics.jsonl) and
  // returns its weighted mean update. Finish tells the clients the run ended.
  StatusOr<int64_t> WaitForClients();
  StatusOr<EdgeRound> RunEdgeRound(const ParameterSet& start, const FitSettings& fit,
                                   uint64_t seed);
  void Finish(const std::string& reason);

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cleave
