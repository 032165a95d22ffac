// Fuzzes the async buffer's journal decoder a server resumes from (server/checkpoint.h):
// whatever it accepts encodes back to the same records.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  size_t complete = 0;
  auto entries = cleave::DecodeBufferJournal(bytes, &complete);
  if (!entries.ok()) return 0;
  if (complete > size) std::abort();
  std::string again;
  for (const auto& e : *entries) again += cleave::EncodeBufferRecord(e);
  size_t complete_again = 0;
  auto round_trip = cleave::DecodeBufferJournal(again, &complete_again);
  if (!round_trip.ok() || complete_again != again.size() ||
      round_trip->size() != entries->size()) {
    std::abort();
  }
  return 0;
}
