// Fuzzes every codec's decoder as the server meets it: an update's encoding checked and
// viewed against the model's layout, then read block by block (and whole), plus a
// compressed model broadcast as a client decodes it. The first byte picks the codec.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "compression/codec.h"
#include "fuzz/fuzz_inputs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  static const ParameterSet layout = fuzz::Layout();
  if (size < 1) return 0;
  const auto& codecs = fuzz::Codecs();
  const std::string& spec = codecs[data[0] % codecs.size()];
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  auto codec = MakeCodec(spec, 7);
  if (!codec.ok()) __builtin_trap();  // every listed spec is valid
  auto views = ViewEncodedTensors(**codec, bytes, layout);
  if (views.ok()) {
    (void)CheckViews(layout, *views, 1e4f);
    float buf[40];
    for (const TensorView& v : *views) {
      for (int64_t b = 0; b < v.numel; b += 40) {
        v.Read(b, v.numel - b < 40 ? v.numel - b : 40, buf);
      }
    }
  }
  (void)DecodeTensors(**codec, bytes, layout);
  (void)DecodeCompressedSet(bytes, spec, 1 << 20);
  return 0;
}
