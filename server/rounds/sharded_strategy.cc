#include "server/rounds/sharded_strategy.h"

namespace cleave {

void ShardedStrategy::Accumulate(const ClientUpdate& update, int worker) {
  const int shard = worker >= 0 && worker < shards_ - 1 ? worker : shards_ - 1;
  MutexLock l(&mu_[shard]);
  strategy_->Accumulate(update, shard);
}

ParameterSet ShardedStrategy::State() const {
  for (int i = 0; i < shards_; ++i) mu_[i].Lock();
  ParameterSet state = strategy_->State();
  for (int i = shards_ - 1; i >= 0; --i) mu_[i].Unlock();
  return state;
}

}  // namespace cleave
