// Fuzzes the job-config parser (YAML text from the operator, or a run directory's
// config.yaml): any text is a config or an INVALID_ARGUMENT, never a crash or a throw.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)cleave::JobConfig::ParseYaml(std::string(reinterpret_cast<const char*>(data), size), "/tmp");
  return 0;
}
