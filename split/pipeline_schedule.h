// The order in which each holder of a pipeline (issue 38) runs its micro-batches'
// forward and backward passes, and one training step of a pipeline held in this process
// (the executor the tests check against the uncut model, and the order a device of a
// chain follows).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "models/part.h"
#include "split/pipeline_plan.h"

namespace cleave {

struct PipelineOp {
  bool forward = true;
  int micro_batch = 0;
};

// Holder `holder` of `holders` (the last holds the loss) with `micro_batches`:
//   GPipe: every forward pass, then every backward pass, in micro-batch order;
//   1F1B (PipeDream-Flush): min(M, holders - 1 - holder) forward passes, then one
//   forward and one backward in turn, then the remaining backward passes, so that at
//   most min(M, holders - holder) micro-batches are in flight on it.
// Every micro-batch's forward before its backward, each once.
std::vector<PipelineOp> PipelineOrder(PipelineSchedule schedule, int holders, int holder, int micro_batches);

struct PipelineStepResult {
  double loss = 0;                 // the batch's mean loss (micro-batches of equal size)
  std::vector<int> max_in_flight;  // per holder: most micro-batches forward but not back
};

// One training step of the pipeline `parts` (stages in order, the last one's output the
// logits): `input` (the first part's, [B, ...]) and `labels` (one per sample, or per
// token for a language model: B x T) cut into `micro_batches` equal micro-batches, each
// part running its passes in PipelineOrder's order (a pass waits for its input from the
// part before, or its gradient from the part after), gradients added up (SetAccumulate),
// then one optimizer step on every part. INVALID_ARGUMENT when the batch does not divide;
// after any other error the parts are left mid-step (ResetOptimizer clears them).
StatusOr<PipelineStepResult> RunLocalPipelineStep(const std::vector<ModelPart*>& parts, const Activations& input,
                                                  const std::vector<int64_t>& labels, int micro_batches,
                                                  PipelineSchedule schedule);

// Token-budget micro-batches (sequence-length balancing): sequences of `lengths` tokens
// (a text micro-batch is cut after its longest, so each costs its count times its
// longest), longest first, packed greedily while a micro-batch's count times its longest
// stays within `budget`; a sequence longer than the budget goes alone. Returns the
// micro-batches as indices into `lengths` (every index once), each's longest first.
std::vector<std::vector<int>> PackByTokens(const std::vector<int64_t>& lengths, int64_t budget);

}  // namespace cleave
