// The job config: one YAML file describes a federation (docs/configuration.md lists
// every key). JobConfig::ParseYaml fills defaults for absent keys and rejects unknown
// keys, wrong types and out-of-range values with INVALID_ARGUMENT naming the key. The
// choices other modules register (strategy.name, aggregation.rule, split.mode,
// train.loss, ...) and the rules that combine modules are checked one layer up, by
// ParseJob / LoadJob (job/job.h): core names no module. (Codecs are checked where the
// server builds them, for their direction.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/fit.h"
#include "core/names.h"
#include "core/status.h"

namespace cleave {

struct RunConfig {
  std::string name = "cleave";   // run.name
  int64_t rounds = 10;           // run.rounds
  uint64_t seed = 42;            // run.seed: client sampling and model init
};

// The built-in decoder's size (model.gpt; models/gpt.h).
struct GptConfig {
  int64_t vocab = 256;    // model.gpt.vocab: the tokenizer's vocabulary
  int64_t context = 128;  // model.gpt.context: the longest sequence, in tokens
  int layers = 4;         // model.gpt.layers
  int heads = 4;          // model.gpt.heads
  int64_t dim = 128;      // model.gpt.dim: the residual stream's width, divisible by heads
  bool tie = false;       // model.gpt.tie: the head reuses the token embedding (as GPT-2)
};

// LoRA adapters (Hu et al. 2021) on the decoder's projections (model.lora): W x + b
// becomes W x + b + (alpha / rank) B A x, with A and B trained and everything else
// frozen; only the adapters are trained, uploaded, aggregated and checkpointed.
struct LoraConfig {
  int rank = 0;          // model.lora.rank: 0 = no adapters
  double alpha = 16;     // model.lora.alpha: the adapters' scale is alpha / rank
  // model.lora.targets: the projections that get adapters (GPT-2's module names)
  std::vector<std::string> targets = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  double dropout = 0;    // model.lora.dropout: on the adapters' input, in training

  bool enabled() const { return rank > 0; }
};

// The projections LoRA can adapt.
const NameTable& LoraTargetNames();

struct ModelConfig {
  std::string name = "lenet5";   // model.name: mlp | lenet5 | cnn | vgg | resnet | gpt |
                                 //   torchscript
  std::string path;              // model.path: TorchScript archive, for name=torchscript
  std::vector<int64_t> input = {1, 28, 28};  // model.input: one example's shape
  int classes = 10;              // model.classes: outputs (labels are in [0, classes))
  // model.personal: globs over tensor names (FedPer / FedBN): tensors that stay on each
  // device, never uploaded or averaged
  std::vector<std::string> personal;
  GptConfig gpt{};               // model.gpt, for name=gpt
  LoraConfig lora{};             // model.lora, for name=gpt
  // model.weights: the starting weights, a safetensors file (GPT-2's layout for gpt,
  // the model's own tensor names otherwise); "" = initialised from run.seed
  std::string weights;
};

struct DataConfig {
  // data.test: the server's test set (a data spec); "" = none, no server evaluation
  std::string test = "fmnist:/usr/share/datasets/fashion-mnist";
  int64_t test_limit = 0;        // data.test_limit: evaluate on the first N; 0 = all
};

struct ClientsConfig {
  int min_clients = 2;           // clients.min: connected clients needed to start a round
  int per_round = 0;             // clients.per_round: sampled per round; 0 = use fraction
  double fraction = 1.0;         // clients.fraction: of connected clients, when per_round = 0
  double quorum = 0.5;           // clients.quorum: fraction of sampled results to commit
  double round_deadline_s = 300; // clients.round_deadline_s
  double join_timeout_s = 600;   // clients.join_timeout_s: wait for clients.min, then fail
  std::string selection = "uniform";  // clients.selection: a Selections() name (server/selection.h)
  double oort_epsilon = 0.2;     // clients.oort_epsilon: the least share that explores
  double oort_alpha = 2;         // clients.oort_alpha: the penalty exponent of slow clients
  int oort_pacer_rounds = 5;     // clients.oort_pacer_rounds: the pacer's window W; 0 = off
  int oort_max_picks = 0;        // clients.oort_max_picks: picks before a client rests; 0 = off
};

// How rounds are scheduled: synchronous rounds (sync), or buffered asynchronous
// aggregation after FedBuff (async; server/coordinator.h, docs/architecture.md).
struct SchedulerConfig {
  std::string mode = "sync";  // scheduler.mode: a Schedulers() name (server/round_registry.h)
  // async: a model version is applied every buffer_size accepted updates
  int buffer_size = 10;                     // scheduler.buffer_size
  int concurrency = 0;                      // scheduler.concurrency: trainers at once; 0 = all
  int max_staleness = 10;                   // scheduler.max_staleness: versions; older refused
  std::string staleness = "polynomial";     // scheduler.staleness: constant | polynomial | hinge
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
  bool async() const { return mode == "async"; }
  bool gossip() const { return mode == "gossip"; }
};

struct TrainConfig {
  int local_epochs = 1;          // train.local_epochs
  int64_t local_steps = 0;       // train.local_steps: batches per task instead of epochs (0 = off)
  int batch_size = 64;           // train.batch_size
  // train.loss: cross_entropy (classification) | bce (binary, one output) | mse | mae
  // (regression, one output, a table's `regression` targets) | torchscript (loss_path)
  std::string loss = "cross_entropy";
  std::string loss_path;  // train.loss_path: the TorchScript loss's archive
  std::string optimizer = "sgd"; // train.optimizer: sgd | adam | adamw
  double lr = 0.05;              // train.lr (the schedule's starting rate)
  double momentum = 0.9;         // train.momentum (sgd)
  bool nesterov = false;         // train.nesterov (sgd with momentum)
  double weight_decay = 0.0;     // train.weight_decay (adamw: decoupled)
  double clip_norm = 0;          // train.clip_norm: the gradient's global L2 norm bound (0 = off)
  double label_smoothing = 0;    // train.label_smoothing
  // The learning rate of each round (ScheduledLr): warm-up, then the schedule.
  std::string schedule = "constant";  // train.schedule: constant | step | cosine
  int warmup_rounds = 0;         // train.warmup_rounds: linear warm-up from lr / W
  int step_rounds = 10;          // train.step_rounds: step: multiply by step_gamma this often
  double step_gamma = 0.1;       // train.step_gamma
  double lr_min = 0;             // train.lr_min: cosine's final rate
};

// The run's training settings (train.*, train.lr unscheduled; FedProx's mu is the
// strategy's and stays 0 here).
FitSettings FitOf(const TrainConfig& t);

// The learning rate clients train with in `round` (1-based) of a run of `rounds`.
// Warm-up: lr * r / W for the first W rounds (torch.optim.lr_scheduler.LinearLR from
// 1/W); then, counting rounds from the end of the warm-up (k = 0, 1, ...): constant lr;
// step: lr * gamma^(k / step_rounds) (StepLR); cosine: lr_min + (lr - lr_min)(1 +
// cos(pi k / K)) / 2 over the K = rounds - W remaining rounds (CosineAnnealingLR).
double ScheduledLr(const TrainConfig& t, int64_t round, int64_t rounds);
// The schedules ScheduledLr knows (core/names.h).
const NameTable& ScheduleNames();
// What a simulated attacker does (local.attack; cleave-client --attack implements them).
const NameTable& AttackNames();
// The fixed choices of core's own sections (the servers' schedulers, topologies,
// staleness rules, selection and weighting implement them).
const NameTable& TopologyNames();       // scheduler.topology
const NameTable& StalenessNames();      // scheduler.staleness
const NameTable& DpNoiseNames();        // dp.noise
const NameTable& WeightingNames();      // aggregation.weighting
// OK when `ok`, else INVALID_ARGUMENT "KEY must be RULE".
Status Range(bool ok, const std::string& key, const std::string& rule);

struct StrategyConfig {
  std::string name = "fedavg";   // strategy.name: fedavg | fedprox | fedavgm | diloco |
                                 //   fedadam | fedyogi | fedadagrad
  double proximal_mu = 0.0;      // strategy.proximal_mu (fedprox)
  double server_lr = 1.0;        // strategy.server_lr (eta; when absent, the strategy's
                                 //   default: 1.0 for fedavg/fedavgm, 0.7 for diloco, 0.1
                                 //   for the adaptive ones; aggregation/registry.cc)
  bool server_lr_given = false;  // whether the job set strategy.server_lr
  double server_momentum = 0.9;  // strategy.server_momentum (fedavgm, diloco)
  double beta1 = 0.9;            // strategy.beta1 (fedadam, fedyogi, fedadagrad)
  double beta2 = 0.99;           // strategy.beta2 (fedadam, fedyogi)
  double tau = 1e-3;             // strategy.tau: adaptivity, added to sqrt(v)
};

// Differential privacy (DP-FedAvg): clipped client updates, Gaussian noise, an RDP
// accountant. See docs/security.md.
struct DpConfig {
  bool enabled = false;           // dp.enabled (true when the section is given)
  double noise_multiplier = 1.0;  // dp.noise_multiplier: z, noise std / clipping norm
  double clip = 1.0;              // dp.clip: L2 clipping norm C (the initial one if adaptive)
  bool adaptive = false;          // dp.adaptive: Andrew et al. 2021 quantile clipping
  double target_quantile = 0.5;   // dp.target_quantile: gamma, the unclipped fraction sought
  double clip_lr = 0.2;           // dp.clip_lr: eta_C
  double clip_count_stddev = 0;   // dp.clip_count_stddev: sigma_b (0 = clients per round / 20)
  std::string noise = "central";  // dp.noise: central (server) | distributed (clients)
  double delta = 1e-5;            // dp.delta
  double target_epsilon = 0;      // dp.target_epsilon: stop before exceeding it (0 = none)
};

// Byzantine-robust aggregation of the round's updates (instead of the weighted mean).
struct AggregationConfig {
  std::string rule = "mean";  // aggregation.rule: mean | median | trimmed_mean | krum |
                              //   multi_krum | bulyan | norm_bound | fltrust
  int f = 0;                  // aggregation.f: attackers to tolerate
  int m = 0;                  // aggregation.m: multi_krum's selection (0 = n - f)
  double max_norm = 0;        // aggregation.max_norm: norm_bound's L2 bound
  std::string root_data;      // aggregation.root_data: FLTrust's clean server data set
  // What a client's update weighs: the example count it declares (bounded below) or 1.
  std::string weighting = "examples";  // aggregation.weighting: examples | equal
  // A client's weight is at most this multiple of the median declared example count of
  // the round's sampled clients (0 = no such cap).
  double max_weight_ratio = 3;         // aggregation.max_weight_ratio
  int64_t max_client_examples = 0;     // aggregation.max_client_examples: absolute cap (0 = none)
};

struct CompressionConfig {
  std::string update = "none";   // compression.update: codec of client updates
  std::string broadcast = "none";  // compression.broadcast: codec of the model sent down
  std::string activations = "none";  // compression.activations: split activations
  std::string gradients = "none";    // compression.gradients: split activation gradients
};

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

// Secure aggregation (SecAgg+, Bell et al. 2020): the server learns only the sum of the
// round's surviving updates. See docs/security.md.
struct SecureAggregationConfig {
  bool enabled = false;     // secure_aggregation.enabled (true when the section is given)
  int k = 6;                // secure_aggregation.k: neighbours per client
  int t = 4;                // secure_aggregation.t: shares needed to recover a secret
  double clip = 1.0;        // secure_aggregation.clip: coordinates clipped to [-clip, clip]
  int bits = 16;            // secure_aggregation.bits: quantization levels 2^bits
  uint64_t modulus = uint64_t{1} << 32;  // secure_aggregation.modulus: the group Z_M
  double stage_timeout_s = 30;  // secure_aggregation.stage_timeout_s: per key/share/unmask stage
};

// Optional bearer token on every call, for deployments whose proxy ends TLS.
struct AuthConfig {
  std::string token_file;  // auth.token_file: the token clients must present ("" = off)
};

struct SplitConfig {
  std::string mode;              // split.mode: "" (federated, the default) | sl | sfl-v1 |
                                 //   sfl-v2 | ushaped
  int cut = 0;                   // split.cut: "auto" (0) or the first server stage
  int tail = 1;                  // split.tail: ushaped: last stages kept by the client
  int window = 1;                // split.window: micro-batches in flight per client
  double activation_noise = 0;   // split.activation_noise: std of Gaussian noise the client
                                 //   adds to the activations it sends (0 = none)
  double nopeek = 0;             // split.nopeek: NoPeek's distance-correlation weight alpha

  bool enabled() const { return !mode.empty(); }
};

// A device to emulate (cleave-client --emulate-*): link speed, slower compute, memory.
struct DeviceEmulation {
  double uplink_mbps = 0;        // 0 = not limited
  double downlink_mbps = 0;
  double slowdown = 1;           // compute takes this many times longer
  int64_t memory_limit_mb = 0;   // declared to the server's cut policy; 0 = none
};

struct LocalConfig {
  std::string data = "fmnist:/usr/share/datasets/fashion-mnist";  // local.data
  std::string partition = "iid";  // local.partition: iid | dirichlet:A | shards:S | labels:K
  uint64_t partition_seed = 42;   // local.partition_seed
  int clients = 10;               // local.clients: default for `cleave local --clients`
  // local.holdout: the fraction of its data each client keeps to evaluate the global
  // model (federated evaluation, cleave-client --holdout); 0 = none
  double holdout = 0;
  std::string attack;             // local.attack: what the attackers do (cleave-client --attack)
  int attackers = 0;              // local.attackers: the last this many clients attack
  // local.profiles: device profiles given to the clients in turn (client i gets
  // profiles[i % size]); empty = no emulation.
  std::vector<DeviceEmulation> profiles;
  // local.trace: a device trace file (core/device_trace.h: speed, links and online
  // windows per client); replaces local.profiles. Empty = none.
  std::string trace;
};

struct JobConfig {
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
  ServerConfig server;
  LocalConfig local;

  // Parses YAML text: every section's keys, types and ranges (see the top of this
  // file; a whole job is ParseJob's, job/job.h). `base_dir` resolves relative paths
  // (model.path).
  static StatusOr<JobConfig> ParseYaml(const std::string& yaml_text, const std::string& base_dir);
  // ParseYaml of the file at `path`; errors start with the path.
  static StatusOr<JobConfig> LoadYaml(const std::string& path);
  // Every key ParseYaml accepts, as SECTION.KEY (local.profiles[].KEY for a profile's).
  static std::vector<std::string> Keys();
};

}  // namespace cleave
