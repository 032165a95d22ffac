// The attacks a simulated attacker can play (core/names.h; cleave-client --attack,
// local.attack). sign-flip: -delta. gaussian: N(0, 1) per coordinate. label-flip:
// trains on labels C-1-y. alie ("A Little Is Enough", tau = 1.5): mu - 1.5 sigma per
// coordinate. ipm (inner-product manipulation, tau = 3): -3 mu. Attackers see no other
// client's update: mu is their own honest update, sigma (alie) the per-coordinate std
// of the updates of 4 shards of their data, each times 4.
#pragma once

#include "core/names.h"

namespace cleave {

inline const NameTable& AttackNames() {
  static const NameTable t{"local.attack", {"sign-flip", "gaussian", "label-flip", "alie", "ipm"}};
  return t;
}

}  // namespace cleave
