// Strategy: how a federation configures rounds and turns client results into the next
// global model. It will feel familiar to Flower users: configure a round, aggregate the
// results given the failures; no result means "keep the previous global model".
//
// Contract:
//  - ConfigureRound picks the round's clients from `available` (sorted ids) with the
//    given RNG, so a seeded run samples the same clients.
//  - Aggregation streams: BeginRound, then Accumulate once per accepted result, as each
//    arrives, then FinishRound. Memory stays O(model size): one running weighted sum,
//    never one copy per client. Accumulate takes an update that the caller has already
//    validated against the global model's layout (CheckViews).
//  - FinishRound with no accumulated result returns FAILED_PRECONDITION and leaves the
//    global model unchanged.
//  - State() and Restore() carry everything that must survive a restart (server
//    optimizer moments); the accumulator is per round and not part of it.
// Not thread-safe: the caller serialises calls.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/parameter_set.h"
#include "core/status.h"

namespace cleave {

// Local-training settings sent with each task.
// What clients train with in a round (train.* in the config; lr as scheduled).
struct FitSettings {
  int local_epochs = 1;
  int64_t local_steps = 0;
  int batch_size = 64;
  std::string loss = "cross_entropy";
  std::string optimizer = "sgd";
  double lr = 0.05;
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = 0.0;
  double clip_norm = 0.0;
  double label_smoothing = 0.0;
  double proximal_mu = 0.0;
};

struct RoundPlan {
  std::vector<std::string> clients;
  FitSettings fit;
  // Set when the run must end before this round (e.g. its privacy budget would be
  // exceeded); the server then ends the run as completed, saying why.
  std::string stop_reason;
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual std::string name() const = 0;

  virtual RoundPlan ConfigureRound(int64_t round, const std::vector<std::string>& available,
                                   std::mt19937_64& rng) = 0;

  // Asynchronous (buffered) aggregation, scheduler.mode: async: what clients train with
  // while model version `version` (a buffer) is being built, and whether the run must
  // end before it. Which clients train is the scheduler's choice: clients are not
  // sampled, plan.clients stays empty.
  virtual RoundPlan ConfigureBuffer(int64_t version) = 0;

  // Starts aggregating a round (or buffer) on top of `global`.
  virtual void BeginRound(const ParameterSet& global) = 0;
  // Folds in one client's update (delta = local - global), weighted by num_examples > 0.
  virtual void Accumulate(const std::vector<TensorView>& delta, int64_t num_examples) = 0;
  // Number of results accumulated since BeginRound.
  virtual int accumulated() const = 0;
  // Applies the round's aggregate to `global` (which must be the BeginRound model).
  virtual Status FinishRound(int num_failures, ParameterSet* global) = 0;

  virtual ParameterSet State() const = 0;
  virtual Status Restore(const ParameterSet& state) = 0;

  // FLTrust: the server's own update this round, trained on its root data; given before
  // FinishRound.
  virtual void SetReference(const ParameterSet& server_update) { (void)server_update; }

  // Extra per-round values for metrics.jsonl after FinishRound (e.g. epsilon).
  virtual std::map<std::string, double> RoundStats() const { return {}; }
};

// Builds the strategy that `config.strategy.name` names (fedavg, fedprox, fedavgm,
// fedadam, fedyogi, fedadagrad) with the job's training and client settings, wrapped
// in a robust rule (`aggregation.rule`) or DP-FedAvg (`dp`) when the job asks: the
// wrapper reduces the round's updates to one, which the inner strategy then applies.
StatusOr<std::unique_ptr<Strategy>> CreateStrategy(const JobConfig& config);

}  // namespace cleave
