// Strategy: how a federation configures rounds and turns client results into the next
// global model. It will feel familiar to Flower users: configure a round (which
// clients, and what each of them trains with), aggregate the results given the
// failures (no result means "keep the previous global model"), aggregate the clients'
// evaluations.
//
// Contract:
//  - ConfigureRound picks the round's clients from `available` (session ids, in a
//    stable order: by client name) with the given RNG, so a seeded run samples the same
//    clients, and may give any of them settings of their own (RoundPlan::client_fit).
//  - Aggregation streams: BeginRound, then Accumulate once per accepted result, as each
//    arrives, then FinishRound. Memory stays O(model size) per shard: a running weighted
//    sum, never one copy per client (robust rules excepted: they need every update).
//    Accumulate takes an update that the caller has already validated against the
//    global model's layout (CheckViews).
//  - Shards: BeginRound(global, shards) opens `shards` partial aggregates. Accumulate
//    calls with different shards may run concurrently (the server's workers each add
//    into their own); calls with the same shard must not. FinishRound merges them.
//    Everything else is called by one thread while no Accumulate runs.
//  - FinishRound with no accumulated result returns FAILED_PRECONDITION and leaves the
//    global model unchanged.
//  - State() and Restore() carry everything that must survive a restart (server
//    optimizer moments); the accumulator is per round and not part of it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "aggregation/options.h"
#include "core/fit.h"
#include "core/parameter_set.h"
#include "core/status.h"
#include "privacy/options.h"

namespace cleave {

// Draws a round's clients: k of the available ones (session ids), sorted. Uniformly with
// the server's seeded RNG (UniformSampler), or by clients.selection's selector
// (server/rounds/selection.h): a strategy asks it for its clients, so a round is sampled once.
using ClientSampler = std::function<std::vector<std::string>(int k)>;

// k of `available`, uniformly: the first k of a partial Fisher-Yates shuffle with `rng`,
// sorted. Both must outlive the sampler.
ClientSampler UniformSampler(const std::vector<std::string>& available, std::mt19937_64& rng);

struct RoundPlan {
  std::vector<std::string> clients;
  FitSettings fit;  // what every client trains with...
  // ...unless it has settings of its own here (by session id, as in `clients`).
  std::map<std::string, FitSettings> client_fit;
  const FitSettings& FitFor(const std::string& client_id) const {
    auto it = client_fit.find(client_id);
    return it == client_fit.end() ? fit : it->second;
  }
  // Set when the run must end before this round (e.g. its privacy budget would be
  // exceeded); the server then ends the run as completed, saying why.
  std::string stop_reason;
  // Federated evaluation (a strategy's configure_evaluate): when set, only these clients
  // (of `clients`) measure the global model before they train, each given its
  // configuration (a JSON object, at most kMaxEvaluateConfigBytes); unset, every client
  // that can does.
  std::optional<std::map<std::string, std::string>> evaluators;
};

// The largest evaluation configuration a task carries (Task.evaluate_config).
inline constexpr size_t kMaxEvaluateConfigBytes = 64 << 10;

// One result as a strategy aggregates it.
struct ClientUpdate {
  // Who sent it: the session id (as ConfigureRound saw it) and the client's name, which
  // stays the same across reconnects and restarts (its certificate's identity under
  // mutual TLS, its --name, else the session id). Both empty for a result that is no
  // single client's: a secure-aggregation sum, a split round's mean, a wrapper's
  // reduction.
  std::string client_id;
  std::string client_name;
  // The model version the client trained from, and how many versions were applied
  // since (scheduler.mode: async; 0 in synchronous rounds).
  int64_t base_version = 0;
  int64_t staleness = 0;
  // local - global, in the round's layout; views into the caller's bytes, read during
  // the call only.
  std::vector<TensorView> delta;
  int64_t weight = 1;  // > 0: the client's examples as RoundWeights bounds them
  double train_loss = 0;

  // A result that is no single client's (no id, name or version).
  static ClientUpdate Unnamed(std::vector<TensorView> delta, int64_t weight) {
    ClientUpdate u;
    u.delta = std::move(delta);
    u.weight = weight;
    return u;
  }
};

// A client's evaluation of a global model on the data it holds out.
struct ClientEvaluationResult {
  std::string client_id;
  std::string client_name;
  int64_t examples = 0;  // > 0
  double accuracy = 0, loss = 0;
  std::map<std::string, double> metrics;  // the loss's other metrics
  double seconds = 0;        // how long the evaluation took
  double train_seconds = 0;  // the same client's training time, for scale
};

// A round's federated evaluation (metrics.jsonl "client_eval").
struct EvaluationSummary {
  int clients = 0;
  int64_t examples = 0;
  double accuracy = 0, loss = 0;
  double accuracy_min = 0, accuracy_median = 0, accuracy_max = 0;
  double loss_min = 0, loss_median = 0, loss_max = 0;
  double seconds = 0;        // mean per client
  double train_seconds = 0;  // mean training time of the same clients
  std::map<std::string, double> metrics;
};

// Accuracy, loss and metrics weighted by examples; min, median and max over clients;
// seconds as means per client. All zero for no results. Of the metrics the clients named,
// the kMaxSummaryMetrics that the most examples measured.
inline constexpr size_t kMaxSummaryMetrics = 64;
EvaluationSummary SummariseEvaluations(const std::vector<ClientEvaluationResult>& results);

class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual std::string name() const = 0;

  // The round's plan: its clients drawn by `sample` (a strategy may also choose them
  // itself from `available`), what they train with.
  virtual RoundPlan ConfigureRound(int64_t round, const std::vector<std::string>& available,
                                   const ClientSampler& sample) = 0;
  // The same, drawing uniformly with `rng`.
  RoundPlan ConfigureRound(int64_t round, const std::vector<std::string>& available, std::mt19937_64& rng) {
    return ConfigureRound(round, available, UniformSampler(available, rng));
  }

  // Asynchronous (buffered) aggregation, scheduler.mode: async: what clients train with
  // while model version `version` (a buffer) is being built, and whether the run must
  // end before it. Which clients train is the scheduler's choice: clients are not
  // sampled, plan.clients stays empty.
  virtual RoundPlan ConfigureBuffer(int64_t version) = 0;

  // Starts aggregating a round (or buffer) on top of `global` into `shards` >= 1
  // partial aggregates.
  virtual void BeginRound(const ParameterSet& global, int shards) = 0;
  // Folds one result into partial aggregate `shard` (0 <= shard < shards).
  virtual void Accumulate(const ClientUpdate& update, int shard) = 0;
  // Number of results accumulated since BeginRound.
  virtual int accumulated() const = 0;
  // Merges the shards and applies the round's aggregate to `global` (which must be the
  // BeginRound model).
  virtual Status FinishRound(int num_failures, ParameterSet* global) = 0;

  // Federated evaluation: the round's client evaluations combined into the round's
  // figures (Flower's aggregate_evaluate). The default weighs by examples.
  virtual EvaluationSummary AggregateEvaluation(
      int64_t round, const std::vector<ClientEvaluationResult>& results) {
    (void)round;
    return SummariseEvaluations(results);
  }

  virtual ParameterSet State() const = 0;
  virtual Status Restore(const ParameterSet& state) = 0;

  // FLTrust: the server's own update this round, trained on its root data; given before
  // FinishRound.
  virtual void SetReference(const ParameterSet& server_update) { (void)server_update; }

  // Width-scaled submodels under DP-FedAvg: how many of the round's results hold each
  // element (every result is zero-padded where it holds none); given before
  // FinishRound. DP divides each element's noised sum by its holders instead of by all
  // the results: post-processing of the same noised sum, so the guarantee is unchanged.
  virtual void SetHolders(const ParameterSet& holders) { (void)holders; }

  // Extra per-round values for metrics.jsonl after FinishRound (e.g. epsilon).
  virtual std::map<std::string, double> RoundStats() const { return {}; }
};

// What a strategy is built from: its own sections, and what it reads of others (the
// server fills it from the job, StrategyJobOf in server/options.h).
struct StrategyJob {
  StrategyConfig strategy;
  AggregationConfig aggregation;
  DpConfig dp;
  TrainConfig train;                  // what clients train with; the schedule of train.lr
  int64_t rounds = 10;                // run.rounds: the schedule's length
  int per_round = 0;                  // clients.per_round: sampled per round; 0 = fraction
  double fraction = 1.0;              // clients.fraction
  std::string update_codec = "none";  // compression.update (":ef21" wraps the strategy)
};

// Builds the strategy that `job.strategy.name` names (a Strategies() name) with the
// job's training and client settings, wrapped in a robust rule (`aggregation.rule`) or
// DP-FedAvg (`dp`) when the job asks: the wrapper reduces the round's updates to one,
// which the inner strategy then applies.
StatusOr<std::unique_ptr<Strategy>> CreateStrategy(const StrategyJob& job);

}  // namespace cleave
