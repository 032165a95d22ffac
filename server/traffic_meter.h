// TrafficMeter: the bytes a run moves, one of the coordinator's components. Three spans:
//   the round's   transport bytes each way (WireSize), what compression saved against
//                 fp32 each way, and the payloads of accepted uploads; zeroed when a
//                 round starts, read into its metrics when it closes;
//   the run's     the committed rounds' transport bytes, kept in the checkpoint;
//   the process's every byte since the server started (the operator's counters).
// Thread-safe and lock-free: the transport counts from any thread, while the round
// thread reads; a count that races with StartRound lands in one round or the other.
#pragma once

#include <atomic>
#include <cstdint>

namespace cleave {

class TrafficMeter {
 public:
  struct Round {
    int64_t up = 0, down = 0;            // transport bytes
    int64_t up_fp32 = 0, down_fp32 = 0;  // what they would have been in fp32
    int64_t updates = 0;                 // accepted uploads' payloads
  };

  void Up(int64_t n) {
    up_ += n;
    lifetime_up_ += n;
  }
  void Down(int64_t n) {
    down_ += n;
    lifetime_down_ += n;
  }
  // Bytes compression saved against an fp32 encoding (may be negative: a codec that
  // grew a small tensor).
  void SavedUp(int64_t n) { saved_up_ += n; }
  void SavedDown(int64_t n) { saved_down_ += n; }
  void AcceptedUpdate(int64_t payload) { updates_ += payload; }

  void StartRound();
  Round RoundSoFar() const;
  // Adds a committed round's transport bytes to the run's.
  void Commit(int64_t up, int64_t down) {
    run_up_ += up;
    run_down_ += down;
  }
  // The run's bytes (checkpointed), and a resumed run's from its checkpoint.
  int64_t run_up() const { return run_up_; }
  int64_t run_down() const { return run_down_; }
  void RestoreRun(int64_t up, int64_t down) {
    run_up_ = up;
    run_down_ = down;
  }
  int64_t lifetime_up() const { return lifetime_up_; }
  int64_t lifetime_down() const { return lifetime_down_; }

 private:
  std::atomic<int64_t> up_{0}, down_{0}, saved_up_{0}, saved_down_{0}, updates_{0};
  std::atomic<int64_t> run_up_{0}, run_down_{0};
  std::atomic<int64_t> lifetime_up_{0}, lifetime_down_{0};
};

}  // namespace cleave
