// Client selection (clients.selection), by registration (Selections()): `uniform` is
// the strategy's own sampling (Strategy::ConfigureRound, no selector); any other entry
// builds a ClientSelector that replaces the strategy's pick in synchronous rounds,
// keeping its size. Built in: `oort`, Oort's
// guided selection (Lai et al., "Oort: Efficient Federated Learning via Guided
// Participant Selection", OSDI 2021), simplified:
//  - a client's statistical utility is its examples x its last training loss, plus a
//    staleness bonus sqrt(0.1 ln(round) / rounds since it last took part);
//  - a client slower than the preferred duration T (a percentile of the known
//    durations, the median at first) has it scaled by (T / duration)^alpha;
//  - the pacer (clients.oort_pacer_rounds = W): every W rounds, when the utility the
//    last W rounds' participants reported is below that of the W before, T moves up
//    by a tenth (the 60th percentile, then the 70th, ... the slowest): the slow clients
//    come back once the fast ones' updates stop teaching much;
//  - a client picked clients.oort_max_picks times is left out of exploitation while
//    enough others are not (Oort's blacklist against over-picking a few);
//  - a share epsilon of the round (decaying from 0.9 by 0.98 a round, down to
//    clients.oort_epsilon) explores clients never tried, uniformly; the rest exploits:
//    sampled in proportion to utility among those within 95 % of the k-th best.
// Transport-free and deterministic for a seeded RNG.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/registry.h"

namespace cleave {

struct ClientsConfig;  // server/options.h

struct ClientRecord {
  double utility = 0;     // examples x mean training loss, last time it trained
  double duration_s = 0;  // from task to accepted update (or the deadline, if it missed)
  int64_t last_round = 0;  // the last round it took part in
};

// What a selector learnt, for the checkpoint (server/checkpoint.h): resuming a run
// resumes its selection.
struct OortState {
  double epsilon = 0.9;
  double percentile = 0.5;      // of the known durations: the preferred duration T
  std::vector<double> utility;  // the pacer's window: reported utility per round
  std::map<std::string, ClientRecord> records;  // clients that reported
  std::map<std::string, int64_t> picks;         // rounds each client was picked for
};

// Picks a round's clients by name, and learns from what they reported.
class ClientSelector {
 public:
  virtual ~ClientSelector() = default;
  // Picks `k` of `available` (client names, sorted) for `round`.
  virtual std::vector<std::string> Select(const std::vector<std::string>& available, int k,
                                          int64_t round, std::mt19937_64& rng) = 0;
  // What the round's participants reported: a client that finished or missed the round.
  virtual void Observe(const std::string& /*name*/, int64_t /*round*/, double /*utility*/,
                       double /*duration_s*/) {}
  virtual void MissedDeadline(const std::string& /*name*/, int64_t /*round*/,
                              double /*deadline_s*/) {}
  // After a round's reports.
  virtual void EndRound() {}
  // What it learnt, for the checkpoint (a selector that learns nothing: nullopt), and
  // that state back on resume.
  virtual std::optional<OortState> Checkpoint() const { return std::nullopt; }
  virtual void Resume(OortState /*state*/) {}
};

// clients.selection's entries; `make` null: uniform (the strategy's sampling).
struct SelectionKind {
  std::function<std::unique_ptr<ClientSelector>(const ClientsConfig& clients)> make;
};
Registry<SelectionKind>& Selections();
inline NameTable SelectionNames() { return Selections().Table(); }

class OortSelector : public ClientSelector {
 public:
  OortSelector(double min_epsilon, double alpha, int pacer_rounds = 0, int max_picks = 0)
      : min_epsilon_(min_epsilon), alpha_(alpha), pacer_rounds_(pacer_rounds), max_picks_(max_picks) {}

  std::vector<std::string> Select(const std::vector<std::string>& available, int k, int64_t round,
                                  std::mt19937_64& rng) override;
  void Observe(const std::string& name, int64_t round, double utility, double duration_s) override;
  void MissedDeadline(const std::string& name, int64_t round, double deadline_s) override;
  // The pacer's step.
  void EndRound() override;
  std::optional<OortState> Checkpoint() const override { return state_; }
  void Resume(OortState s) override { state_ = std::move(s); }

  const std::map<std::string, ClientRecord>& records() const { return state_.records; }
  double epsilon() const { return state_.epsilon; }
  double percentile() const { return state_.percentile; }

 private:
  double min_epsilon_, alpha_;
  int pacer_rounds_, max_picks_;
  OortState state_;
  double round_utility_ = 0;  // reported in the round being observed
};

}  // namespace cleave
