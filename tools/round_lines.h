// What `cleave local` and `cleave simulate` print while a run goes: one line per round
// from the run's metrics.jsonl, and the helpers those lines use.
#pragma once

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace cleave {

// 1.2 MB, 3.4 kB, ...
std::string Bytes(double b);
// A metrics line's accuracy (RMSE for regression, perplexity for text): the server's
// test set, else the clients' held-out data (federated evaluation, with the spread over
// clients), else none.
std::string AccuracyText(const nlohmann::json& j);
// YYYYmmdd-HHMMSS, local time: run directory names.
std::string Timestamp();

// Follows RUN_DIR/metrics.jsonl (which may not exist yet) and prints each new line.
class RoundPrinter {
 public:
  RoundPrinter(std::string run_dir, int64_t rounds) : run_dir_(std::move(run_dir)), rounds_(rounds) {}
  // Prints the rounds committed since the last call (an incomplete last line waits).
  void Drain();
  const nlohmann::json& last() const { return last_; }  // the last line read
  int64_t total_up() const { return total_up_; }
  int64_t total_down() const { return total_down_; }

 private:
  const std::string run_dir_;
  const int64_t rounds_;
  std::ifstream metrics_;
  std::string partial_;
  nlohmann::json last_;
  int64_t total_up_ = 0, total_down_ = 0;
};

}  // namespace cleave
