// Internal to aggregation/: the streaming accumulate every strategy and wrapper uses.
#pragma once

#include <vector>

#include "core/parameter_set.h"

namespace cleave {

// out += scale * delta, tensor by tensor (out has delta's layout), reading each view
// block by block so that a compressed update is never decoded whole.
void AddScaled(const std::vector<TensorView>& delta, float scale, ParameterSet* out);

}  // namespace cleave
