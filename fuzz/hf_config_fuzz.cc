// Fuzzes config.json (models/hf_config.h), which a server reads from a model folder and a
// device takes from the server: any text is a decoder's shape or an INVALID_ARGUMENT. A
// shape it accepts has tensors whose sizes do not overflow, and what HfConfigJson writes
// of it reads back the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "models/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto c = cleave::ParseHfConfig(std::string(reinterpret_cast<const char*>(data), size), "fuzz/config.json");
  if (!c.ok()) return 0;
  if (cleave::HfModelBytes(*c) <= 0) std::abort();
  auto again = cleave::ParseHfConfig(cleave::HfConfigJson(*c), "again");
  if (!again.ok() || again->dim != c->dim || again->layers != c->layers || again->vocab != c->vocab ||
      again->heads != c->heads || again->kv_heads != c->kv_heads || again->head_dim != c->head_dim) {
    std::abort();
  }
  return 0;
}
