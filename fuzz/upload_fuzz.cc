// Fuzzes what an upload and a control stream bring in before any state is touched: the
// protobuf messages (ClientMessage, UploadChunk, SplitUp, SecAggRequest) and, for an
// upload chunk, its data as a parameter set against the model's layout.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "cleave/v1/cleave.pb.h"
#include "core/parameter_set.h"
#include "core/printable.h"
#include "fuzz/fuzz_inputs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cleave;
  static const ParameterSet layout = fuzz::Layout();
  const int n = static_cast<int>(size);
  v1::ClientMessage control;
  if (control.ParseFromArray(data, n) && control.has_join()) {
    (void)Printable(control.join().name());
  }
  v1::UploadChunk chunk;
  if (chunk.ParseFromArray(data, n)) {
    if (chunk.has_header()) {
      (void)Printable(chunk.header().client_id());
      (void)Printable(chunk.header().task_id());
    }
    auto views = ParseParameterSet(chunk.data(), 1 << 20);
    if (views.ok()) (void)CheckViews(layout, *views, 1e4f);
  }
  v1::SplitUp split;
  (void)split.ParseFromArray(data, n);
  v1::SecAggRequest secagg;
  (void)secagg.ParseFromArray(data, n);
  return 0;
}
