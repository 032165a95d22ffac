// Fuzzes the safetensors reader (models/safetensors.h) a server or `cleave` runs on a
// checkpoint file (model.weights, cleave generate --checkpoint): whatever it accepts
// writes out and reads back the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "models/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto ps = cleave::ParseSafetensors(std::string_view(reinterpret_cast<const char*>(data), size),
                                     "fuzz.safetensors");
  if (!ps.ok()) return 0;
  auto again = cleave::ParseSafetensors(cleave::SerializeSafetensors(*ps), "again");
  if (!again.ok() || again->size() != ps->size()) std::abort();
  return 0;
}
