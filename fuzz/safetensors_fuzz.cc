// Fuzzes the safetensors reader (models/safetensors.h) a server or `cleave` runs on a
// checkpoint file (model.weights, cleave generate --checkpoint): whatever it accepts
// writes out and reads back the same, and reading each tensor straight into memory of
// its shape (SafetensorsFilter::into, as a device's part reads its folder) gives the
// same values.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "models/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto ps = cleave::ParseSafetensors(std::string_view(reinterpret_cast<const char*>(data), size),
                                     "fuzz.safetensors");
  if (!ps.ok()) return 0;
  auto again = cleave::ParseSafetensors(cleave::SerializeSafetensors(*ps), "again");
  if (!again.ok() || again->size() != ps->size()) std::abort();
  std::map<std::string, std::vector<float>> room;
  cleave::SafetensorsFilter filter;
  filter.into = [&room](const std::string& name, const std::vector<int64_t>& shape) -> cleave::StatusOr<float*> {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto& values = room[name];
    values.assign(static_cast<size_t>(n), 0.0f);
    return values.data();
  };
  auto into = cleave::ParseSafetensors(std::string_view(reinterpret_cast<const char*>(data), size),
                                       "fuzz.safetensors", filter);
  if (!into.ok() || into->size() != 0 || room.size() != ps->size()) std::abort();
  for (const cleave::Tensor& t : ps->tensors()) {
    const std::vector<float>& got = room.at(t.name);
    if (got.size() != t.values.size() ||
        (!got.empty() && std::memcmp(got.data(), t.values.data(), got.size() * sizeof(float)) != 0)) {
      std::abort();
    }
  }
  return 0;
}
