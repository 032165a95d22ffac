#include "server/checkpoint.h"

#include <cmath>
#include <map>
#include <sstream>

#include <zlib.h>

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

std::string EncodeBufferRecord(const BufferEntry& e) {
  v1::BufferEntry p;
  p.set_version(e.version);
  p.set_task_round(e.task_round);
  p.set_staleness(e.staleness);
  p.set_weight(e.weight);
  p.set_scale(e.scale);
  p.set_train_loss(e.train_loss);
  p.set_steps(e.steps);
  p.set_width(e.width);
  p.set_edge(e.edge);
  p.set_client_name(e.client_name);
  p.set_codec(e.codec);
  p.set_payload(e.payload);
  const std::string body = p.SerializeAsString();
  const uint32_t n = static_cast<uint32_t>(body.size());
  const uint32_t crc = static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size())));
  std::string out(8, '\0');
  for (int i = 0; i < 4; ++i) {
    out[i] = static_cast<char>(n >> (8 * i));
    out[4 + i] = static_cast<char>(crc >> (8 * i));
  }
  return out + body;
}

StatusOr<std::vector<BufferEntry>> DecodeBufferJournal(std::string_view bytes, size_t* complete) {
  *complete = 0;
  std::vector<BufferEntry> out;
  size_t at = 0;
  auto u32 = [&](size_t i) {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[i + k])) << (8 * k);
    return v;
  };
  while (at < bytes.size()) {
    if (bytes.size() - at < 8) break;  // torn
    const uint32_t n = u32(at), crc = u32(at + 4);
    if (n > bytes.size() - at - 8) break;  // torn
    const std::string_view body = bytes.substr(at + 8, n);
    const uint32_t got = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size())));
    if (got != crc) {
      if (at + 8 + n == bytes.size()) break;  // torn
      return absl::DataLossError(absl::StrCat("record at byte ", at, ": CRC mismatch"));
    }
    v1::BufferEntry p;
    if (!p.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
      return absl::DataLossError(absl::StrCat("record at byte ", at, " does not parse"));
    }
    if (p.version() < 1 || p.task_round() < 1 || p.task_round() > p.version() ||
        p.staleness() != p.version() - p.task_round() || p.weight() < 1 || p.steps() < 0 ||
        !std::isfinite(p.train_loss()) || !std::isfinite(p.scale()) || p.scale() < 0 ||
        p.scale() > 1 || p.codec().empty() || !(p.width() >= 0 && p.width() <= 1)) {
      return absl::DataLossError(absl::StrCat("record at byte ", at, " holds impossible values"));
    }
    BufferEntry e;
    e.version = p.version();
    e.task_round = p.task_round();
    e.staleness = p.staleness();
    e.weight = p.weight();
    e.scale = p.scale();
    e.train_loss = p.train_loss();
    e.steps = p.steps();
    e.width = p.width();
    e.edge = p.edge();
    e.client_name = p.client_name();
    e.codec = p.codec();
    e.payload = p.payload();
    out.push_back(std::move(e));
    at += 8 + n;
    *complete = at;
  }
  return out;
}

}  // namespace cleave
