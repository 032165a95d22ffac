// The compression section of a job config: a codec spec per direction (docs/codecs.md;
// core/config_section.h; the job layer registers it, job/job.cc). Each spec is
// checked where its codec is built, for its direction (Coordinator::Init names the key).
#pragma once

#include <string>

#include "core/config_section.h"

namespace cleave {

struct CompressionConfig {
  std::string update = "none";   // compression.update: codec of client updates
  std::string broadcast = "none";  // compression.broadcast: codec of the model sent down
  std::string activations = "none";  // compression.activations: split activations
  std::string gradients = "none";    // compression.gradients: split activation gradients
};

void ReadCompression(ConfigSection& s, CompressionConfig& c);

}  // namespace cleave
