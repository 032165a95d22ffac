#include "server/checkpoint.h"

#include <cmath>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "cleave/v1/cleave.pb.h"

namespace cleave {

std::string EncodeCheckpoint(const Checkpoint& ck) {
  v1::Checkpoint p;
  p.set_run_id(ck.run_id);
  p.set_round(ck.round);
  p.set_global_model(ck.global.Encode());
  p.set_strategy_state(ck.strategy_state.Encode());
  std::ostringstream rng;
  rng << ck.rng;
  p.set_rng_state(rng.str());
  p.set_bytes_up(ck.bytes_up);
  p.set_bytes_down(ck.bytes_down);
  p.set_wall_s(ck.wall_s);
  return p.SerializeAsString();
}

StatusOr<Checkpoint> DecodeCheckpoint(std::string_view bytes) {
  if (bytes.empty()) return absl::DataLossError("empty file");
  v1::Checkpoint p;
  if (!p.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::DataLossError("not a checkpoint (does not parse)");
  }
  Checkpoint ck;
  ASSIGN_OR_RETURN(ck.global, ParameterSet::Decode(p.global_model()));
  if (Status finite = CheckViews(ck.global, ViewsOf(ck.global)); !finite.ok()) {
    return absl::DataLossError(absl::StrCat("the model is not usable: ", finite.message()));
  }
  ASSIGN_OR_RETURN(ck.strategy_state, ParameterSet::Decode(p.strategy_state()));
  std::istringstream rng(p.rng_state());
  rng >> ck.rng;
  if (rng.fail()) return absl::DataLossError("bad RNG state");
  if (p.round() < 0 || p.bytes_up() < 0 || p.bytes_down() < 0 || !std::isfinite(p.wall_s()) ||
      p.wall_s() < 0) {
    return absl::DataLossError("negative or non-finite counters");
  }
  ck.run_id = p.run_id();
  ck.round = p.round();
  ck.bytes_up = p.bytes_up();
  ck.bytes_down = p.bytes_down();
  ck.wall_s = p.wall_s();
  return ck;
}

}  // namespace cleave
