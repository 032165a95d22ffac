// An edge aggregator's upload under an upstream running width-scaled submodels
// (docs/protocol.md): its devices' per-element mean, tensor by tensor, then each
// tensor's per-element share of the edge's weight, in [0, 1], named NAME + this suffix.
// The edge's client writes it (client/client_tasks.cc); the upstream's WidthDriver reads it.
#pragma once

namespace cleave {

inline constexpr char kEdgeWeightSuffix[] = "#weight";

}  // namespace cleave
