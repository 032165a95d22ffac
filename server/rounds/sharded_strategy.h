// ShardedStrategy: the run's strategy and the locks of its partial aggregates
// (Strategy::BeginRound's shards), one of the coordinator's components. There is one shard
// per upload worker and one more for every other thread. Uploads add into their worker's
// shard in parallel, without the coordinator's mutex, while a round is open. The round
// thread uses the strategy otherwise only when no upload is in flight, or (State, for a
// checkpoint) with every shard locked.
#pragma once

#include <memory>

#include "absl/base/thread_annotations.h"
#include "aggregation/strategy.h"
#include "core/mutex.h"
#include "core/parameter_set.h"

namespace cleave {

class ShardedStrategy {
 public:
  // `workers`: the upload workers (server.worker_threads).
  explicit ShardedStrategy(int workers) : shards_(workers + 1), mu_(new Mutex[shards_]) {}

  void Set(std::unique_ptr<Strategy> strategy) { strategy_ = std::move(strategy); }
  Strategy& get() { return *strategy_; }
  int shards() const { return shards_; }

  // Strategy::BeginRound over every shard.
  void BeginRound(const ParameterSet& layout) { strategy_->BeginRound(layout, shards_); }
  // Adds `update` into `worker`'s shard; a thread outside the pool (`worker` < 0) into
  // the last.
  void Accumulate(const ClientUpdate& update, int worker);
  // Strategy::State with every shard locked: no Accumulate runs meanwhile.
  ParameterSet State() const ABSL_NO_THREAD_SAFETY_ANALYSIS;  // a loop over an array of mutexes

 private:
  const int shards_;
  const std::unique_ptr<Mutex[]> mu_;
  std::unique_ptr<Strategy> strategy_;
};

}  // namespace cleave
