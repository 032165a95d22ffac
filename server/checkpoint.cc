#include "server/checkpoint.h"

#include <cmath>
#include <map>
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
  if (ck.oort) {
    v1::OortState* o = p.mutable_oort();
    o->set_epsilon(ck.oort->epsilon);
    o->set_percentile(ck.oort->percentile);
    for (double u : ck.oort->utility) o->add_utility(u);
    std::map<std::string, v1::OortState::Client> clients;
    for (const auto& [name, r] : ck.oort->records) {
      auto& c = clients[name];
      c.set_utility(r.utility);
      c.set_duration_s(r.duration_s);
      c.set_last_round(r.last_round);
    }
    for (const auto& [name, n] : ck.oort->picks) clients[name].set_picks(n);
    for (auto& [name, c] : clients) {
      c.set_name(name);
      *o->add_clients() = std::move(c);
    }
  }
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
  if (p.has_oort()) {
    const v1::OortState& o = p.oort();
    auto bad = [](double x) { return !std::isfinite(x) || x < 0; };
    if (bad(o.epsilon()) || o.epsilon() > 1 || bad(o.percentile()) || o.percentile() > 1) {
      return absl::DataLossError("selection state: epsilon or percentile outside [0, 1]");
    }
    OortState s;
    s.epsilon = o.epsilon();
    s.percentile = o.percentile();
    for (double u : o.utility()) {
      if (!std::isfinite(u)) return absl::DataLossError("selection state: non-finite utility");
      s.utility.push_back(u);
    }
    for (const auto& c : o.clients()) {
      if (!std::isfinite(c.utility()) || bad(c.duration_s()) || c.last_round() < 0 ||
          c.last_round() > p.round() || c.picks() < 0) {
        return absl::DataLossError("selection state: a client's record is out of range");
      }
      if (s.picks.count(c.name())) return absl::DataLossError("selection state: a client twice");
      s.picks[c.name()] = c.picks();
      if (c.last_round() > 0) s.records[c.name()] = {c.utility(), c.duration_s(), c.last_round()};
    }
    ck.oort = std::move(s);
  }
  return ck;
}

}  // namespace cleave
