// What a simulated attacker does (cleave-client --attack, local.attack; client.cc
// implements them): experiments on robust aggregation.
#pragma once

#include "core/names.h"

namespace cleave {

inline const NameTable& AttackNames() {
  static const NameTable t{"local.attack", {"sign-flip", "gaussian", "label-flip", "alie", "ipm"}};
  return t;
}

}  // namespace cleave
