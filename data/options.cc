#include "data/options.h"

namespace cleave {

void ReadData(ConfigSection& s, DataConfig& c) {
  s.Read("test", c.test);
  s.Read("test_limit", c.test_limit);
}

Status CheckData(DataConfig& c) {
  return Range(c.test_limit >= 0, "data.test_limit", ">= 0 (0 = all)");
}

}  // namespace cleave
