// Per-device LoRA ranks (job section width, method hetlora or flexlora). A device of rate
// r trains adapters of rank r x model.lora.rank: the leading block of the federation's
// (A's and B's first ranks), at the federation's scale alpha / model.lora.rank, so that a
// rank's component means the same on every device and a device starts from the
// federation's adapters truncated to its rank.
//
// Aggregation: HetLoRA (Cho et al. 2024) pads each device's adapters with zeros to the
// full rank and averages them (SubmodelSum::ZeroPadded, aggregation/submodel.h);
// FlexLoRA (Bai et al. 2024) averages each projection's full low-rank product and
// factors the mean back by SVD (FlexLoraSum). No LibTorch in this header.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/parameter_set.h"
#include "core/status.h"
#include "models/model.h"

namespace cleave {

// The adapters (a LoRA model's ".lora_A" and ".lora_B" tensors at spec.lora.rank, in
// model order) cut to `rank`: the layout a device of that rank trains, values zero.
// INVALID_ARGUMENT for a tensor that is not an adapter or a rank outside [1, rank].
StatusOr<ParameterSet> AdaptersAtRank(const ModelSpec& spec, const ParameterSet& adapters, int64_t rank);

// The model.lora.alpha that gives adapters of `rank` the federation's scale.
double AlphaAtRank(const LoraConfig& lora, int64_t rank);

// FlexLoRA's round: each projection's mean product of the devices' trained adapters,
// factored back at the full rank. Thread-safe.
class FlexLoraSum {
 public:
  // `adapters`: the federation's adapters at spec.lora.rank, the round's start.
  static StatusOr<std::unique_ptr<FlexLoraSum>> Create(const ModelSpec& spec, const ParameterSet& adapters);
  ~FlexLoraSum();

  // A device's update at `rank` (its adapters' delta, in AdaptersAtRank's layout):
  // adds `weight` x each projection's product of its trained adapters (the start's
  // leading block plus the delta). INVALID_ARGUMENT for another layout.
  Status Add(const std::vector<TensorView>& delta, int64_t rank, double weight);
  // The new adapters at the full rank: per projection the weighted mean product P,
  // factored by SVD P = U S V^T as left = U sqrt(S), right = sqrt(S) V^T (the rank
  // dimension last on the left factor, first on the right), so that every leading block
  // is P's best approximation of that rank. The start when nothing was added.
  StatusOr<ParameterSet> Result() const;

 private:
  struct Impl;
  explicit FlexLoraSum(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cleave
