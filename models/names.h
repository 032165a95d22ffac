// The optimizers and losses local training knows, as name tables (core/names.h) of
// their registries (models/optimizers.h, models/losses.h): the job layer checks
// train.optimizer and train.loss against them, the docs test reads them.
// ModelPartTest.EveryOptimizerSteps... runs every optimizer of the table,
// OptimizerMatchesPyTorchTest every loss against torch.
#pragma once

#include "core/names.h"
#include "models/losses.h"
#include "models/optimizers.h"

namespace cleave {

inline NameTable OptimizerNames() { return Optimizers().Table(); }
inline NameTable LossNames() { return Losses().Table(); }

}  // namespace cleave
