#include "client/emulation.h"

#include <algorithm>
#include <thread>

namespace cleave {

using SteadyClock = std::chrono::steady_clock;

TokenBucket::TokenBucket(double bytes_per_s, double burst_bytes)
    : rate_(bytes_per_s), burst_(burst_bytes), tokens_(burst_bytes), last_(SteadyClock::now()) {}

void TokenBucket::Consume(int64_t bytes) {
  if (bytes > 0) passed_.fetch_add(bytes, std::memory_order_relaxed);
  if (rate_ <= 0 || bytes <= 0) return;
  SteadyClock::time_point wake;
  {
    MutexLock l(&mu_);
    const auto now = SteadyClock::now();
    tokens_ = std::min(burst_, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
    last_ = now;
    tokens_ -= static_cast<double>(bytes);  // may go into debt: later callers wait for it
    if (tokens_ >= 0) return;
    wake = now + std::chrono::duration_cast<SteadyClock::duration>(
                     std::chrono::duration<double>(-tokens_ / rate_));
  }
  std::this_thread::sleep_until(wake);
}

DeviceEmulator::DeviceEmulator(double uplink_mbps, double downlink_mbps, double slowdown_factor)
    : up(uplink_mbps * 1e6 / 8), down(downlink_mbps * 1e6 / 8), slowdown(std::max(1.0, slowdown_factor)) {}

void DeviceEmulator::Compute(double seconds) const {
  if (slowdown > 1 && seconds > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>((slowdown - 1) * seconds));
  }
}

}  // namespace cleave
