#include "compression/options.h"

namespace cleave {

void ReadCompression(ConfigSection& s, CompressionConfig& c) {
  s.Read("update", c.update);
  s.Read("broadcast", c.broadcast);
  s.Read("activations", c.activations);
  s.Read("gradients", c.gradients);
}

}  // namespace cleave
