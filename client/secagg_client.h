// The client's side of SecAgg+ (Task.secagg set); server/modes/secagg_round.h has the
// stages. Before training the client advertises fresh keys and sends sealed shares of
// its secrets to the neighbours the server names; after training it uploads its update
// clipped, scaled by its weight, quantized and masked, and answers the unmasking
// request: for each neighbour the self-seed share if it survived, the mask-key share if
// it dropped, never both.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>

#include "cleave/v1/cleave.grpc.pb.h"
#include "client/emulation.h"
#include "core/parameter_set.h"
#include "core/status.h"

namespace cleave {

// The next control-stream message about this task. ABORTED when the server moved on (a
// new task or the end of the run arrived instead; the caller keeps that message).
using NextMessage = std::function<Status(v1::ServerMessage*)>;

// A pipeline's device under secure aggregation: the vector it masks, `split`'s
// secagg_length values, zero but where each tensor of `delta` (its part's, in order)
// begins at its secagg_offsets entry. INVALID_ARGUMENT when they do not fit.
StatusOr<ParameterSet> MaskedPipelineVector(const v1::SplitTask& split, const ParameterSet& delta);

// Per-slice masking (a width-scaled submodel's device): where a submodel's values sit in
// the summed vector of `length` values, from its placement (one entry per tensor,
// row-major over each dimension's kept indices). INVALID_ARGUMENT when a tensor or index
// falls outside, or two values would share a position.
StatusOr<std::vector<int64_t>> PlacedPositions(
    const google::protobuf::RepeatedPtrField<v1::SubmodelPlacement>& placement, int64_t length);

class SecAggClient {
 public:
  ~SecAggClient();
  SecAggClient(SecAggClient&&) noexcept;
  SecAggClient& operator=(SecAggClient&&) noexcept;

  // Stages 1 and 2.
  static StatusOr<SecAggClient> Prepare(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                        const v1::Task& task, const NextMessage& next);
  // Stages 3 and 4: `delta` is the trained model minus the global one (a pipeline's
  // device: its masked vector, MaskedPipelineVector; a submodel's: its own tensors, of the
  // shapes SecAggTask.placement keeps), scaled by `weight` over max_weight
  // (its examples; a pipeline's device: its chain's weight); `examples` is what the
  // upload declares; `split`, a split task's stats.
  StatusOr<v1::UploadReply> Submit(v1::Coordinator::Stub* stub, const v1::Welcome& w,
                                   const v1::Task& task, const ParameterSet& delta,
                                   int64_t examples, int64_t weight, double loss, double seconds,
                                   DeviceEmulator* emulator, const NextMessage& next,
                                   const v1::SplitStats* split = nullptr);

 private:
  struct State;
  explicit SecAggClient(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace cleave
