#include "server/modes/gossip_driver.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "server/modes/topology.h"
#include "server/options.h"
#include "server/server.h"

namespace cleave {

Status GossipDriver::ChooseLocked(int64_t round, const FitSettings& /*fit*/,
                                 std::vector<std::string>* clients) {
  tasks_.clear();
  reports_.clear();
  std::vector<std::pair<std::string, std::string>> peers;  // (name, id)
  for (const auto& cid : *clients) {
    const Session& s = *ctx_.FindSessionLocked(cid);
    if (s.peer_address.empty()) {
      spdlog::warn("round {}: client {} ({}) serves no Peer address: left out of gossip",
                   round, cid, s.name);
      continue;
    }
    peers.emplace_back(s.name, cid);
  }
  if (peers.empty()) {
    return absl::AbortedError(absl::StrCat("round ", round, ": no client serves a Peer address"));
  }
  std::sort(peers.begin(), peers.end());
  const auto& sc = run_.config().scheduler;
  std::vector<double> uplinks;
  for (const auto& [name, cid] : peers) {
    auto u = uplinks_.find(cid);
    uplinks.push_back(u != uplinks_.end() ? u->second : 0.0);
  }
  const GossipGraph g = MakeGossipGraph(static_cast<int>(peers.size()), sc.topology, sc.degree,
                                        ctx_.RngLocked(), uplinks);
  std::map<std::pair<int, int>, std::string> tokens;  // one secret per edge
  clients->clear();
  for (size_t i = 0; i < peers.size(); ++i) {
    v1::GossipTask gt;
    gt.set_self_weight(g.self_weight[i]);
    gt.set_rule(sc.gossip_rule);
    gt.set_byzantine(sc.gossip_byzantine);
    for (const auto& [j, w] : g.neighbours[i]) {
      const int self = static_cast<int>(i);
      std::string& token = tokens[{std::min(self, j), std::max(self, j)}];
      if (token.empty()) token = RandomHex(16);
      const Session& s = *ctx_.FindSessionLocked(peers[j].second);
      v1::GossipTask::Neighbour* n = gt.add_neighbours();
      n->set_name(s.name);
      n->set_address(s.peer_address);
      n->set_weight(w);
      n->set_token(token);
    }
    tasks_[peers[i].second] = std::move(gt);
    clients->push_back(peers[i].second);
  }
  std::string measured;
  if (sc.topology == "measured") {
    double lo = 0, hi = 0;
    int known = 0;
    for (double u : uplinks) {
      if (u <= 0) continue;
      lo = known ? std::min(lo, u) : u;
      hi = std::max(hi, u);
      ++known;
    }
    measured = absl::StrFormat(" (%d uplinks measured, %.3g to %.3g Mbit/s)", known, lo, hi);
  }
  spdlog::info("round {}: gossip over a {} of {} clients, {} edges{}", round, sc.topology,
               peers.size(), tokens.size(), measured);
  return absl::OkStatus();
}

void GossipDriver::PrepareTaskLocked(v1::Task* task, TaskRecord* rec) {
  *task->mutable_gossip() = tasks_[rec->client_id];
  rec->expected_size = static_cast<int64_t>(ParameterSet().EncodedSize());
}

Status GossipDriver::CheckUploadLocked(const TaskRecord& /*t*/, const v1::UploadHeader& h) {
  const auto& g = h.gossip();
  if (g.neighbours() < 0 || g.heard() < 0 || g.heard() > g.neighbours() ||
      g.clipped() < 0 || g.clipped() > g.heard() ||
      g.neighbours() > 1024 || g.bytes_sent() < 0 || g.bytes_received() < 0 ||
      !std::isfinite(g.disagreement()) || g.disagreement() < 0 ||
      !std::isfinite(g.uplink_mbps()) || g.uplink_mbps() < 0) {
    return absl::InvalidArgumentError(
        "gossip stats: counts and bytes must be >= 0, clipped <= heard <= neighbours <= 1024, "
        "disagreement and uplink_mbps finite and >= 0");
  }
  return absl::OkStatus();
}

bool GossipDriver::TakeLocked(const v1::UploadHeader& /*h*/, const std::string& /*payload*/,
                              const TaskRecord& /*t*/, Status* status) {
  *status = absl::OkStatus();  // its size (an empty set) and its report were checked
  return true;
}

void GossipDriver::CloseLocked(int64_t /*round*/, RoundMetrics* m) {
  GossipMetrics& gm = m->gossip.emplace();
  double weighted = 0;  // disagreement x neighbours heard
  for (const auto& [id, t] : ctx_.TasksLocked()) {
    auto report = reports_.find(id);
    if (t.state != TaskState::kDone || report == reports_.end()) continue;
    const v1::GossipStats& g = report->second;
    gm.neighbours += g.neighbours();
    gm.heard += g.heard();
    gm.clipped += g.clipped();
    gm.peer_bytes += g.bytes_sent();
    weighted += g.disagreement() * g.heard();
    if (g.uplink_mbps() > 0 && ctx_.FindSessionLocked(t.client_id)) {  // finite: checked
      auto [u, first] = uplinks_.emplace(t.client_id, g.uplink_mbps());
      if (!first) u->second = (u->second + g.uplink_mbps()) / 2;
    }
  }
  gm.disagreement = gm.heard > 0 ? weighted / gm.heard : 0;
  tasks_.clear();
  reports_.clear();
}

}  // namespace cleave
