#include "data/options.h"

namespace cleave {

void ReadData(ConfigSection& s, DataConfig& c) {
  s.Read("test", c.test);
  s.Read("test_limit", c.test_limit);
  s.Read("dataset", c.dataset);
}

Status CheckData(DataConfig& c) {
  RETURN_IF_ERROR(Range(c.dataset.size() <= 128 && c.dataset.find_first_of(" \t\n/") == std::string::npos,
                        "data.dataset", "a name of at most 128 characters, no spaces or slashes"));
  return Range(c.test_limit >= 0, "data.test_limit", ">= 0 (0 = all)");
}

}  // namespace cleave
