// The model a run trains, one of the coordinator's components, in two parts by who may
// touch them:
//   ModelState      what Init fixes, read by every thread without a lock: the model's
//                   description, which of its tensors updates carry and blobs hold
//                   (ModelLayout), and a quantized base's weights;
//   CommittedModel  what a committed round replaces, under the coordinator's mutex: the
//                   weights, the digest of the blob clients fetch them as, the round.
#pragma once

#include <cstdint>
#include <string>

#include "compression/quantized_set.h"
#include "core/parameter_set.h"
#include "models/model.h"
#include "server/model_layout.h"

namespace cleave {

struct ModelState {
  ModelSpec spec;
  ModelLayout layout;
  // model.quantize: the whole model's quantized weights (their bytes shared with the
  // evaluation model's; their blob is TaskAssets::quantized_base). Empty without.
  QuantizedSet quantized_base;

  // The layout of an update (and of the strategy's sums) of `global`.
  const ParameterSet& UpdateLayout(const ParameterSet& global) const {
    return layout.UpdateLayout(global);
  }
};

struct CommittedModel {
  ParameterSet weights;
  // The digest of the blob clients fetch `weights` as ("" until the first is published).
  std::string digest;
  // The last committed round: the one `weights` came from, or a later one that kept them
  // (gossip commits rounds whose models stay on the clients). 0 before the first.
  int64_t round = 0;
};

}  // namespace cleave
