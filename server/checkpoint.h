// The checkpoint a server writes to RUN_DIR/checkpoint.pb after every committed round
// (proto cleave.v1.Checkpoint) and resumes from. No LibTorch and no gRPC: the decoder is
// fuzzed (fuzz/checkpoint_fuzz.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "core/parameter_set.h"
#include "core/status.h"
#include "server/selection.h"

namespace cleave {

struct Checkpoint {
  std::string run_id;
  int64_t round = 0;            // the last committed round
  ParameterSet global;          // exact float32 model, whatever the broadcast codec
  ParameterSet strategy_state;  // Strategy::State()
  std::mt19937_64 rng;          // client sampling
  int64_t bytes_up = 0, bytes_down = 0;
  double wall_s = 0;            // wall time of the run so far
  std::optional<OortState> oort;  // clients.selection: oort
};

std::string EncodeCheckpoint(const Checkpoint& ck);

// DATA_LOSS (or the ParameterSet decoder's error) unless `bytes` is a complete
// checkpoint whose model is finite, whose counters are >= 0, whose RNG state reads and
// whose selection state (if any) is finite, non-negative and within its ranges.
// Messages do not name the file: the caller adds its path.
StatusOr<Checkpoint> DecodeCheckpoint(std::string_view bytes);

}  // namespace cleave
