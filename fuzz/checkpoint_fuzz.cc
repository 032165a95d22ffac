// Fuzzes the checkpoint decoder a server resumes from (server/checkpoint.h).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto ck = cleave::DecodeCheckpoint(std::string_view(reinterpret_cast<const char*>(data), size));
  if (ck.ok()) (void)cleave::EncodeCheckpoint(*ck);
  return 0;
}
