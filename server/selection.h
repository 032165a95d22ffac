// Client selection (clients.selection). Uniform sampling is the strategy's own
// (Strategy::ConfigureRound); `oort` replaces its pick, keeping its size, by Oort's
// guided selection (Lai et al., "Oort: Efficient Federated Learning via Guided
// Participant Selection", OSDI 2021), simplified:
//  - a client's statistical utility is its examples x its last training loss, plus a
//    staleness bonus sqrt(0.1 ln(round) / rounds since it last took part);
//  - a client slower than the preferred duration T (the median of the known durations)
//    has it scaled by (T / duration)^alpha;
//  - a share epsilon of the round (decaying from 0.9 by 0.98 a round, down to
//    clients.oort_epsilon) explores clients never tried, uniformly; the rest exploits:
//    sampled in proportion to utility among those within 95 % of the k-th best.
// Transport-free and deterministic for a seeded RNG.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace cleave {

struct ClientRecord {
  double utility = 0;     // examples x mean training loss, last time it trained
  double duration_s = 0;  // from task to accepted update (or the deadline, if it missed)
  int64_t last_round = 0;  // the last round it took part in
};

class OortSelector {
 public:
  OortSelector(double min_epsilon, double alpha) : min_epsilon_(min_epsilon), alpha_(alpha) {}

  // Picks `k` of `available` (client names) for `round`.
  std::vector<std::string> Select(const std::vector<std::string>& available, int k, int64_t round,
                                  std::mt19937_64& rng);
  // What the round's participants reported: a client that finished or missed the round.
  void Observe(const std::string& name, int64_t round, double utility, double duration_s);
  void MissedDeadline(const std::string& name, int64_t round, double deadline_s);

  const std::map<std::string, ClientRecord>& records() const { return records_; }
  double epsilon() const { return epsilon_; }

 private:
  double min_epsilon_, alpha_;
  double epsilon_ = 0.9;
  std::map<std::string, ClientRecord> records_;
};

}  // namespace cleave
