// Width-scaled submodels (HeteroFL, Diao et al. 2021; FedRolex, Alam et al. 2022; job
// section `width`): where a submodel's tensors sit in the whole model's, and the mean of
// the devices' submodel updates element by element. No LibTorch: layouts come in as
// ParameterSets (names and shapes).
//
// A submodel keeps, of every hidden layer, a window of its output channels or features;
// the next layer keeps the same window of its inputs (after a flatten, each kept
// channel's block of positions; a residual shortcut, the window of the earlier layer
// whose outputs it takes). HeteroFL's window is the leading one; FedRolex's starts
// at `roll` (its round's index) and wraps around. The input and the classes are whole.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "aggregation/options.h"
#include "core/parameter_set.h"
#include "core/status.h"

namespace cleave {

// Where a submodel's tensor sits in the whole model's: for each dimension, the indices of
// the whole tensor's that it keeps, in its own order. Its elements' flat positions are
// the row-major product of these lists (PositionsOf).
using Kept = std::vector<std::vector<int64_t>>;

// Each *Positions function below has a *Kept twin that gives every tensor's Kept instead
// of its flat positions (what a device needs to place its submodel in the whole model:
// secure aggregation with width).
StatusOr<std::vector<Kept>> SubmodelKept(const ParameterSet& whole, const ParameterSet& sub, int64_t roll);
StatusOr<std::vector<Kept>> DecoderKept(const ParameterSet& whole, const ParameterSet& sub, int64_t head_dim,
                                        int64_t group, int64_t roll);
StatusOr<std::vector<Kept>> LeadingKept(const ParameterSet& whole, const ParameterSet& sub);
// The flat positions of `kept` in `whole`'s tensors (shapes), tensor by tensor.
std::vector<std::vector<int64_t>> PositionsOf(const ParameterSet& whole, const std::vector<Kept>& kept);

// For each tensor of `sub` (the whole model's tensors, in order, each no larger in any
// dimension), the flat positions in the whole model's tensor of its elements, in its
// own row-major order. Tensors are read in order as layers: a weight ([out, in, ...]) and
// then its bias or its normalization's weight and bias ([out]). INVALID_ARGUMENT when the
// layouts differ in names or rank, or a smaller input dimension does not follow from the
// layer before (nor from an earlier layer of as many outputs: a shortcut).
StatusOr<std::vector<std::vector<int64_t>>> SubmodelPositions(const ParameterSet& whole, const ParameterSet& sub,
                                                             int64_t roll);

// The same for a decoder whose submodel keeps a window of each block's heads (of
// `head_dim` elements each) and of its MLP features. GPT-2's layout (models/gpt.h;
// Conv1D weights [in, out]): the packed q|k|v projection ("attn.c_attn") keeps the
// window of heads in each third of its outputs, the attention's output projection
// ("attn.c_proj") the same heads as inputs. The Llama family's (models/llama.h; weights
// [out, in]): the window is of key/value heads, each with its `group` query heads
// ("k_proj", "v_proj" outputs: the kept key/value heads; "q_proj" outputs and "o_proj"
// inputs: their groups' query heads). Any other cut dimension (the MLP's features) keeps
// a window of its own. Windows start at `roll` (modulo their size) as
// SubmodelPositions'; every other dimension stays whole.
StatusOr<std::vector<std::vector<int64_t>>> DecoderPositions(const ParameterSet& whole, const ParameterSet& sub,
                                                            int64_t head_dim, int64_t group, int64_t roll);

// For each tensor of `sub` (as above), the positions of the leading block: in every
// dimension, its first indices (per-device LoRA ranks: a lower rank's adapters).
StatusOr<std::vector<std::vector<int64_t>>> LeadingPositions(const ParameterSet& whole, const ParameterSet& sub);

// The submodel's values: `whole`'s elements at `positions`, in `sub`'s layout.
ParameterSet Gather(const ParameterSet& whole, const ParameterSet& sub,
                    const std::vector<std::vector<int64_t>>& positions);

// A device's update (its submodel's layout, as views) in the whole model's layout: its
// values at `positions`, zero elsewhere (what DP-FedAvg clips and sums).
StatusOr<ParameterSet> Placed(const std::vector<TensorView>& delta, const std::vector<std::vector<int64_t>>& positions,
                              const ParameterSet& whole);

// Adds 1 to `holders` (the whole model's layout) at every element of `positions`: after
// each device of a round, how many hold each element.
void CountHolders(const std::vector<std::vector<int64_t>>& positions, ParameterSet* holders);

// The round's submodel updates, summed into the whole model's layout: each element's
// weighted sum and the weights of the devices that hold it. Thread-safe.
class SubmodelSum {
 public:
  explicit SubmodelSum(const ParameterSet& whole);
  // A device's update (its submodel's layout, as views) placed at `positions`, weighted.
  Status Add(const std::vector<TensorView>& delta, const std::vector<std::vector<int64_t>>& positions,
             double weight);
  // A sum of devices' updates (an edge aggregator's mean, `delta`) whose elements carry
  // weights of their own (`weights`, the same layout: each element's holders' weight).
  Status AddWeighted(const std::vector<TensorView>& delta, const std::vector<TensorView>& weights);
  // Per element, the weighted mean over the devices that hold it; 0 where none does.
  ParameterSet Mean() const;
  // Per element, the weight of the devices that hold it.
  ParameterSet Weights() const;
  // HetLoRA's zero-padded mean, as a change of `start` (the values the devices started
  // from): each device's values (start plus its delta) padded with zeros where it holds
  // no element, averaged over all the devices; an element only some hold shrinks
  // towards 0 by the weight of those that do not.
  ParameterSet ZeroPadded(const ParameterSet& start) const;

 private:
  mutable std::mutex mu_;
  ParameterSet layout_;
  std::vector<std::vector<double>> sum_, weight_;
  double total_ = 0;  // the weight of every device added
};

// The round's submodel updates kept whole, for a robust aggregation.rule applied element by
// element over the devices that hold each element: `median` (the holders' median),
// `trimmed_mean` (their mean without the f largest and f smallest; every element must
// be held by more than 2f devices) and `norm_bound` (each device's delta scaled to an L2
// norm of at most max_norm, then the holders' weighted mean). The rules that compare
// whole updates (krum, multi_krum, bulyan, fltrust) are not defined between submodels of
// different shapes. Thread-safe.
class SubmodelUpdates {
 public:
  explicit SubmodelUpdates(const ParameterSet& whole) : layout_(whole) {}
  // A device's update (its submodel's layout, as views) placed at `positions`, weighted.
  Status Add(const std::vector<TensorView>& delta,
             std::shared_ptr<const std::vector<std::vector<int64_t>>> positions, double weight);
  // The rule's result per element, in the whole model's layout; 0 where no device holds
  // an element. FAILED_PRECONDITION when the rule is not defined here, or trimmed_mean
  // finds an element held by 2f devices or fewer.
  StatusOr<ParameterSet> Aggregate(const AggregationConfig& rule) const;

 private:
  struct Update {
    std::shared_ptr<const std::vector<std::vector<int64_t>>> positions;
    std::vector<std::vector<float>> values;  // per tensor, in the submodel's order
    double weight = 0;
  };
  mutable std::mutex mu_;
  ParameterSet layout_;
  std::vector<Update> updates_;
};

}  // namespace cleave
