// Device emulation for heterogeneity experiments: a token bucket per link direction
// (applied to the bytes of every message the client sends or receives) and slower
// compute (after a computation of t seconds the client idles (slowdown - 1) * t).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "core/mutex.h"

namespace cleave {

// Lets bytes pass at `bytes_per_s` on average with bursts up to `burst_bytes`.
// 0 bytes/s = unlimited. Thread-safe.
class TokenBucket {
 public:
  explicit TokenBucket(double bytes_per_s = 0, double burst_bytes = 16 << 10);
  // Blocks until `bytes` may pass.
  void Consume(int64_t bytes);
  // The bytes that passed (or are waiting to), limited or not.
  int64_t passed() const { return passed_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> passed_{0};
  const double rate_;
  const double burst_;
  Mutex mu_;
  double tokens_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point last_ ABSL_GUARDED_BY(mu_);
};

struct DeviceEmulator {
  DeviceEmulator(double uplink_mbps, double downlink_mbps, double slowdown);
  TokenBucket up, down;
  const double slowdown;
  // Call after computing for `seconds`: idles for the emulated extra time.
  void Compute(double seconds) const;
};

}  // namespace cleave
