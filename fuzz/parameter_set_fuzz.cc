// Fuzzes the parameter-set wire encoding (uploads, checkpoints, model downloads):
// parsing, then the server's checks against a layout, then reading every value.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/parameter_set.h"
#include "fuzz/fuzz_inputs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  static const ParameterSet layout = fuzz::Layout();
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto views = ParseParameterSet(bytes, 1 << 20);
  if (!views.ok()) return 0;
  if (CheckViews(layout, *views, 1e4f).ok()) {
    float sum = 0, buf[64];
    for (const TensorView& v : *views) {
      for (int64_t b = 0; b < v.numel; b += 64) {
        const int64_t n = v.numel - b < 64 ? v.numel - b : 64;
        v.Read(b, n, buf);
        for (int64_t j = 0; j < n; ++j) sum += buf[j];
      }
    }
    (void)sum;
  }
  auto decoded = ParameterSet::Decode(bytes, 1 << 20);
  if (decoded.ok()) (void)decoded->Encode();
  return 0;
}
