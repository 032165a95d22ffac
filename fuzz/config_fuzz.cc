// Fuzzes the job-config parser (YAML text from the operator, or a run directory's
// config.yaml): any text is a config or an INVALID_ARGUMENT, never a crash or a throw.
// Every section's reader and checks run, and the rules that combine them; the names a
// section picks from a registry above its module (train.loss, scheduler.mode, ...) are
// looked up in registries this tree does not build (LibTorch, the server), so here any
// name passes that step.
#include <cstddef>
#include <cstdint>
#include <string>

#include "job/job.h"

namespace cleave {
Status CheckRegisteredNames(const JobConfig&) { return absl::OkStatus(); }
}  // namespace cleave

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)cleave::ParseJob(std::string(reinterpret_cast<const char*>(data), size), "/tmp");
  return 0;
}
