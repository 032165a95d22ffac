// The streaming accumulate every strategy and wrapper uses (and the width driver's sums
// of a start and a change).
#pragma once

#include <vector>

#include "core/parameter_set.h"

namespace cleave {

// out += scale * delta, tensor by tensor (out has delta's layout), reading each view
// block by block so that a compressed update is never decoded whole.
void AddScaled(const std::vector<TensorView>& delta, float scale, ParameterSet* out);

// A round's weighted sum kept as partial sums, one per shard (Strategy's contract:
// different shards may be added to concurrently). A shard's sum is allocated when it is
// first added to and its memory kept for later rounds, so memory is the model once per
// shard in use. Not thread-safe beyond that.
class PartialSums {
 public:
  // Empties every shard; there are at least `shards` of them from now on.
  void Reset(int shards);
  // Shard `shard`: sum += scale * delta; weight += weight; one more result.
  void Add(int shard, const std::vector<TensorView>& delta, float scale, double weight);
  // The sum over every shard (added in shard order into the first one used), valid
  // until the next Reset; null when nothing was added.
  ParameterSet* Merge();
  double weight() const;  // of the results added since Reset
  int count() const;

 private:
  struct Shard {
    ParameterSet sum;
    bool used = false;  // sum holds this round's values
    double weight = 0;
    int count = 0;
  };
  std::vector<Shard> shards_;
};

}  // namespace cleave
