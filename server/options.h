// The server's own sections of a job config (run, clients, scheduler, server, tls, auth;
// core/config_section.h; the job layer registers them, job/job.cc), and
// FederationConfig: every section the coordinator runs a federation from, each declared
// beside the module that owns it. The job layer's JobConfig (job/job.h) adds what only
// `cleave local` reads.
#pragma once

#include <cstdint>
#include <string>

#include "aggregation/options.h"
#include "aggregation/strategy.h"
#include "compression/options.h"
#include "core/config_section.h"
#include "core/fit.h"
#include "core/names.h"
#include "data/options.h"
#include "models/options.h"
#include "privacy/options.h"
#include "split/options.h"

namespace cleave {

struct RunConfig {
  std::string name = "cleave";   // run.name
  int64_t rounds = 10;           // run.rounds
  uint64_t seed = 42;            // run.seed: client sampling and model init
  // run.priority: under a daemon, jobs of a higher priority start first and the fifo
  // scheduler gives them clients first
  int priority = 0;
  // run.target_accuracy: end the run, completed, after the first round whose test
  // accuracy (the server's evaluation) reaches it; 0 = run every round
  double target_accuracy = 0;
};

struct ClientsConfig {
  int min_clients = 2;           // clients.min: connected clients needed to start a round
  int per_round = 0;             // clients.per_round: sampled per round; 0 = use fraction
  double fraction = 1.0;         // clients.fraction: of connected clients, when per_round = 0
  double quorum = 0.5;           // clients.quorum: fraction of sampled results to commit
  double round_deadline_s = 300; // clients.round_deadline_s
  double join_timeout_s = 600;   // clients.join_timeout_s: wait for clients.min, then fail
  std::string selection = "uniform";  // clients.selection: a Selections() name (server/rounds/selection.h)
  double oort_epsilon = 0.2;     // clients.oort_epsilon: the least share that explores
  double oort_alpha = 2;         // clients.oort_alpha: the penalty exponent of slow clients
  int oort_pacer_rounds = 5;     // clients.oort_pacer_rounds: the pacer's window W; 0 = off
  int oort_max_picks = 0;        // clients.oort_max_picks: picks before a client rests; 0 = off
};

// How rounds are scheduled: synchronous rounds (sync), buffered asynchronous aggregation
// after FedBuff (async), or decentralised rounds (gossip); docs/architecture.md.
struct SchedulerConfig {
  std::string mode = "sync";  // scheduler.mode: a Schedulers() name (server/rounds/round_registry.h)
  // async: a model version is applied every buffer_size accepted updates
  int buffer_size = 10;                     // scheduler.buffer_size
  int concurrency = 0;                      // scheduler.concurrency: trainers at once; 0 = all
  int max_staleness = 10;                   // scheduler.max_staleness: versions; older refused
  // A client's updates in one buffer: at most ceil(max_client_share x buffer_size) (1 with
  // dp), unless no other client is training or can train; 1 = no bound but the buffer's.
  double max_client_share = 1;              // scheduler.max_client_share, in (0, 1]
  // scheduler.staleness: constant | polynomial | hinge (aggregation/staleness.h)
  std::string staleness = "polynomial";
  double staleness_exponent = 0.5;          // scheduler.staleness_exponent: polynomial a, hinge a
  int staleness_hinge = 4;                  // scheduler.staleness_hinge: hinge b
  // Staleness control: each task's local steps are sized from its client's measured speed
  // and the rate versions are applied, so that its update arrives about target_staleness
  // versions after the one it trains from; 0 = off (every task gets train's work).
  int target_staleness = 0;                 // scheduler.target_staleness
  int64_t min_local_steps = 1;              // scheduler.min_local_steps: the fewest a task gets
  // gossip: clients average with their neighbours over this graph, drawn each round
  std::string topology = "ring";            // scheduler.topology: ring | random | measured
  int degree = 4;                           // scheduler.degree: random, measured: up to this many neighbours
  // How a client combines its neighbours' models (aggregation/gossip_mix.h): mean | clipped |
  // trimmed, and the share of a client's neighbour weight the robust rules assume hostile.
  std::string gossip_rule = "mean";         // scheduler.gossip_rule
  double gossip_byzantine = 0.5;            // scheduler.gossip_byzantine, in [0, 1)
  bool async() const { return mode == "async"; }
  bool gossip() const { return mode == "gossip"; }
};

// The graphs gossip rounds draw (scheduler.topology; server/modes/topology.h).
const NameTable& TopologyNames();

struct ServerConfig {
  std::string listen = "0.0.0.0:7070";   // server.listen
  double heartbeat_s = 2.0;              // server.heartbeat_s: client heartbeat interval
  double client_timeout_s = 15.0;        // server.client_timeout_s: silent client = gone
  int64_t max_model_elements = 1LL << 28;// server.max_model_elements: upload size limit
  int chunk_bytes = 1 << 20;             // server.chunk_bytes: download/upload chunk size
  int eval_batch_size = 256;             // server.eval_batch_size
  int worker_threads = 2;                // server.worker_threads: decode/aggregate pool
  bool evaluate = true;                  // server.evaluate: evaluate on data.test each round
  // server.final_evaluation: after the last round, clients that hold data out measure
  // the final model (federated evaluation of the model the run ends with)
  bool final_evaluation = true;
  double max_update_abs = 1e4;           // server.max_update_abs: bound on |update value|
  // server.record_updates: the server keeps the first N whole-model updates of each round
  // as received, with the model they started from (split/record.h), for a curious
  // server's gradient inversion (cleave attack updates); 0 = none
  int record_updates = 0;
  double upload_idle_timeout_s = 30;     // server.upload_idle_timeout_s: stalled upload = failed
  double handshake_timeout_s = 10;       // server.handshake_timeout_s: TLS/HTTP/2 handshake
  int max_sessions = 0;                  // server.max_sessions: 0 = from the fd limit
  int max_connections = 0;               // server.max_connections: 0 = from the fd limit
  // server.metrics_listen: host:port of the operator's endpoint (Prometheus /metrics, the
  // dashboard); "" = off. Plain HTTP on a loopback address, else HTTPS with tls.cert.
  std::string metrics_listen;
  int metrics_client_series = 100;       // server.metrics_client_series: per-client series cap
};

// TLS on the server's port. Without a certificate the server refuses to start unless
// told --insecure (ServerOptions::insecure).
struct TlsConfig {
  std::string cert;      // tls.cert: the server's certificate chain (PEM)
  std::string key;       // tls.key: its private key (PEM)
  std::string ca;        // tls.ca: the federation CA that client certificates must chain to
  bool mutual = false;   // tls.mutual: require a client certificate; its CN is the identity
  int reload_s = 60;     // tls.reload_s: how often the files are re-read
  std::string revoked;   // tls.revoked: revoked device identities, one CN a line (re-read too)
};

// Optional bearer token on every call, for deployments whose proxy ends TLS.
struct AuthConfig {
  std::string token_file;  // auth.token_file: the token clients must present ("" = off)
};

// Every section a coordinator runs a federation from.
struct FederationConfig {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  ClientsConfig clients;
  SchedulerConfig scheduler;
  TrainConfig train;
  StrategyConfig strategy;
  AggregationConfig aggregation;
  DpConfig dp;
  SplitConfig split;
  CompressionConfig compression;
  TlsConfig tls;
  AuthConfig auth;
  SecureAggregationConfig secure_aggregation;
  WidthConfig width;
  ServerConfig server;

  // Whether clients serve the Peer service (--peer-listen): gossip rounds exchange
  // models, a pipeline's devices micro-batches, peer to peer.
  bool ClientsServePeer() const { return scheduler.gossip() || split.Is(SplitMode::kPipeline); }
};

// What the job's strategy is built from (CreateStrategy).
StrategyJob StrategyJobOf(const FederationConfig& c);

void ReadRun(ConfigSection& s, RunConfig& c);
Status CheckRun(RunConfig& c);
// clients.selection and scheduler.mode name entries of the server's registries, which
// the job layer checks (job/registered_names.cc).
void ReadClients(ConfigSection& s, ClientsConfig& c);
Status CheckClients(ClientsConfig& c);
void ReadScheduler(ConfigSection& s, SchedulerConfig& c);
Status CheckScheduler(SchedulerConfig& c);
void ReadServer(ConfigSection& s, ServerConfig& c);
Status CheckServer(ServerConfig& c);
void ReadTls(ConfigSection& s, TlsConfig& c);
Status CheckTls(TlsConfig& c);
void ReadAuth(ConfigSection& s, AuthConfig& c);

}  // namespace cleave
