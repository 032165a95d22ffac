#include "server/gossip_driver.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "server/topology.h"

namespace cleave {

Status GossipDriver::BeginLocked(int64_t round, const FitSettings& /*fit*/,
                                 std::vector<std::string>* clients) {
  tasks_.clear();
  std::vector<std::pair<std::string, std::string>> peers;  // (name, id)
  for (const auto& cid : *clients) {
    const Session& s = c_.sessions_[cid];
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
  const auto& sc = c_.cfg_.scheduler;
  std::vector<double> uplinks;
  for (const auto& [name, cid] : peers) uplinks.push_back(c_.sessions_[cid].uplink_mbps);
  const GossipGraph g = MakeGossipGraph(static_cast<int>(peers.size()), sc.topology, sc.degree,
                                        c_.rng_, uplinks);
  std::map<std::pair<int, int>, std::string> tokens;  // one secret per edge
  clients->clear();
  for (size_t i = 0; i < peers.size(); ++i) {
    v1::GossipTask gt;
    gt.set_self_weight(g.self_weight[i]);
    for (const auto& [j, w] : g.neighbours[i]) {
      const int self = static_cast<int>(i);
      std::string& token = tokens[{std::min(self, j), std::max(self, j)}];
      if (token.empty()) token = RandomHex(16);
      const Session& s = c_.sessions_[peers[j].second];
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
  rec->gossip = true;
  rec->expected_size = static_cast<int64_t>(ParameterSet().EncodedSize());
}

bool GossipDriver::TakeLocked(const v1::UploadHeader& /*h*/, const std::string& /*payload*/,
                              const TaskRecord& t, Status* status) {
  if (!t.gossip) return false;
  *status = absl::OkStatus();  // its size (an empty set) and its report were checked
  return true;
}

void GossipDriver::CloseLocked(int64_t /*round*/, RoundMetrics* m) {
  m->gossip = true;
  double weighted = 0;  // disagreement x neighbours heard
  for (const auto& [id, t] : c_.tasks_) {
    if (!t.gossip || t.state != TaskState::kDone) continue;
    const v1::GossipStats& g = t.gossip_stats;
    m->neighbours += g.neighbours();
    m->heard += g.heard();
    m->peer_bytes += g.bytes_sent();
    weighted += g.disagreement() * g.heard();
    auto s = c_.sessions_.find(t.client_id);
    if (g.uplink_mbps() > 0 && s != c_.sessions_.end()) {  // finite: CheckUploadHeader
      double& u = s->second.uplink_mbps;
      u = u > 0 ? (u + g.uplink_mbps()) / 2 : g.uplink_mbps();
    }
  }
  m->disagreement = m->heard > 0 ? weighted / m->heard : 0;
  tasks_.clear();
}

}  // namespace cleave
