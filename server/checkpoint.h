// The checkpoint a server writes to RUN_DIR/checkpoint.pb after every committed round
// (proto cleave.v1.Checkpoint) and resumes from. No LibTorch and no gRPC: the decoder is
// fuzzed (fuzz/checkpoint_fuzz.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/parameter_set.h"
#include "core/status.h"
#include "server/rounds/selection.h"

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

// scheduler.mode: async: one update of an open buffer, as journaled (proto
// cleave.v1.BufferEntry).
struct BufferEntry {
  int64_t version = 0;
  int64_t task_round = 0;
  int64_t staleness = 0;
  int64_t weight = 0;
  float scale = 1;
  double train_loss = 0;
  int64_t steps = 0;
  double width = 0;  // the task's submodel rate (TaskRecord::width); 0: the whole model
  bool edge = false;  // an edge aggregator's upload (TaskRecord::edge)
  std::string client_name;
  std::string codec;
  std::string payload;
};

// One framed journal record: length, CRC-32, the encoded entry.
std::string EncodeBufferRecord(const BufferEntry& e);

// The complete records of a journal, and in *complete the bytes they take. A last
// record cut short (a crash while it was written: a length past the end, or a CRC that
// does not match and nothing after it) is left out (*complete < bytes.size()); a bad
// record with more after it, or a record that does not parse or holds impossible
// values (negative counts, a version or staleness that do not add up, a non-finite
// loss, a scale outside [0, 1]), is DATA_LOSS naming its offset.
StatusOr<std::vector<BufferEntry>> DecodeBufferJournal(std::string_view bytes, size_t* complete);

}  // namespace cleave
