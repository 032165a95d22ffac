// Internal to python/src: a Strategy whose decisions are a Python object's
// (cleave.Strategy's shape, python/cleave/server.py), for cleave.start_server.
#pragma once

#include <memory>

#include "aggregation/strategy.h"
#include "python/src/common.h"

namespace cleave::python {

// `strategy` deciding what it defines (configure_fit, configure_evaluate, aggregate_fit,
// aggregate_evaluate, evaluate, state and load_state), `fallback` (the job's built-in
// strategy) the rest. Called with the GIL held. INVALID_ARGUMENT for a strategy with one
// of state() and load_state() but not the other.
StatusOr<std::unique_ptr<Strategy>> MakePythonStrategy(const py::object& strategy, std::unique_ptr<Strategy> fallback);

}  // namespace cleave::python
