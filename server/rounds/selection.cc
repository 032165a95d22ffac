#include "server/rounds/selection.h"

#include "server/options.h"

#include <algorithm>
#include <cmath>

namespace cleave {

void OortSelector::Observe(const std::string& name, int64_t round, double utility,
                           double duration_s) {
  ClientRecord& r = state_.records[name];
  r.utility = utility;
  r.duration_s = duration_s;
  r.last_round = round;
  round_utility_ += utility;
}

void OortSelector::EndRound() {
  if (pacer_rounds_ <= 0) return;
  std::vector<double>& u = state_.utility;
  u.push_back(round_utility_);
  round_utility_ = 0;
  const size_t w = static_cast<size_t>(pacer_rounds_);
  if (u.size() < 2 * w) return;
  double before = 0, last = 0;
  for (size_t i = 0; i < w; ++i) before += u[i];
  for (size_t i = w; i < 2 * w; ++i) last += u[i];
  if (last < before) state_.percentile = std::min(1.0, state_.percentile + 0.1);
  u.erase(u.begin(), u.begin() + w);  // the next step compares the next W rounds
}

void OortSelector::MissedDeadline(const std::string& name, int64_t round, double deadline_s) {
  ClientRecord& r = state_.records[name];
  r.duration_s = std::max(r.duration_s, deadline_s);
  r.last_round = round;
}

std::vector<std::string> OortSelector::Select(const std::vector<std::string>& available, int k,
                                              int64_t round, std::mt19937_64& rng) {
  k = std::min<int>(k, available.size());
  auto& records = state_.records;
  std::vector<std::string> explored, unexplored, over_picked;
  std::vector<double> durations;
  for (const auto& name : available) {
    auto it = records.find(name);
    if (it == records.end()) {
      unexplored.push_back(name);
    } else {
      auto p = state_.picks.find(name);
      const bool over = max_picks_ > 0 && p != state_.picks.end() && p->second >= max_picks_;
      (over ? over_picked : explored).push_back(name);
      durations.push_back(it->second.duration_s);
    }
  }
  double preferred = 0;  // T: the pacer's percentile of the known durations
  if (!durations.empty()) {
    // (+1e-9: the pacer's sums of tenths, 0.7999..., still name the 80th percentile)
    const size_t i = std::min(durations.size() - 1,
                              static_cast<size_t>(state_.percentile * durations.size() + 1e-9));
    std::nth_element(durations.begin(), durations.begin() + i, durations.end());
    preferred = durations[i];
  }
  int explore = std::min<int>(unexplored.size(), static_cast<int>(std::round(state_.epsilon * k)));
  // The over-picked only where the others do not fill the round.
  if (static_cast<int>(explored.size()) < k - explore) {
    explored.insert(explored.end(), over_picked.begin(), over_picked.end());
  }
  int exploit = std::min<int>(explored.size(), k - explore);
  explore = std::min<int>(unexplored.size(), k - exploit);  // fill from the other side
  state_.epsilon = std::max(min_epsilon_, state_.epsilon * 0.98);

  std::vector<std::string> out;
  // Exploit: utility with staleness bonus and system penalty; the candidates within 95 %
  // of the k-th best, drawn in proportion to utility without replacement.
  std::vector<std::pair<double, std::string>> scored;
  for (const auto& name : explored) {
    const ClientRecord& r = records.at(name);
    const double since = std::max<int64_t>(1, round - r.last_round);
    double u = r.utility + std::sqrt(0.1 * std::log(std::max<int64_t>(2, round)) / since);
    if (preferred > 0 && r.duration_s > preferred) u *= std::pow(preferred / r.duration_s, alpha_);
    scored.emplace_back(u, name);
  }
  std::sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  if (exploit > 0) {
    const double cutoff = 0.95 * scored[exploit - 1].first;
    std::vector<std::pair<double, std::string>> pool;
    for (const auto& s : scored) {
      if (s.first >= cutoff) pool.push_back(s);
    }
    for (int i = 0; i < exploit; ++i) {
      double total = 0;
      for (const auto& p : pool) total += std::max(p.first, 1e-12);
      double x = std::uniform_real_distribution<double>(0, total)(rng);
      size_t j = 0;
      for (; j + 1 < pool.size(); ++j) {
        x -= std::max(pool[j].first, 1e-12);
        if (x <= 0) break;
      }
      out.push_back(pool[j].second);
      pool.erase(pool.begin() + j);
    }
  }
  // Explore: never-tried clients, uniformly.
  std::shuffle(unexplored.begin(), unexplored.end(), rng);
  out.insert(out.end(), unexplored.begin(), unexplored.begin() + explore);
  std::sort(out.begin(), out.end());
  for (const auto& name : out) ++state_.picks[name];
  return out;
}

Registry<SelectionKind>& Selections() {
  static Registry<SelectionKind>* selections = [] {
    auto* r = new Registry<SelectionKind>("clients.selection");
    r->AddBuiltin("uniform", {nullptr});
    r->AddBuiltin("oort", {[](const ClientsConfig& c) -> std::unique_ptr<ClientSelector> {
                    return std::make_unique<OortSelector>(c.oort_epsilon, c.oort_alpha,
                                                          c.oort_pacer_rounds, c.oort_max_picks);
                  }});
    return r;
  }();
  return *selections;
}

}  // namespace cleave
