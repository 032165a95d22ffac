// The split-learning modes (core/names.h); ParseSplitMode maps each to its SplitMode.
#pragma once

#include "core/names.h"

namespace cleave {

inline const NameTable& SplitModeNames() {
  static const NameTable t{"split.mode", {"sl", "sfl-v1", "sfl-v2", "ushaped", "pipeline"}};
  return t;
}

}  // namespace cleave
