// Time for deadlines and timeouts, injected so that tests move it by hand.
//
// The coordinator reads every deadline (round, join, heartbeat, idle upload, SecAgg
// stage, TLS reload) from a Clock and waits through it. RealClock is steady_clock;
// FakeClock stands still until Advance() moves it, so a test that waits for a timeout
// says when it happens instead of sleeping past it, and passes on a loaded machine.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "core/mutex.h"

namespace cleave {

class Clock {
 public:
  using duration = std::chrono::steady_clock::duration;
  using time_point = std::chrono::steady_clock::time_point;

  virtual ~Clock() = default;
  virtual time_point Now() const = 0;
  // Blocks on `cv` (`mu` held, released while blocked) until it is signalled or this
  // clock reaches `deadline`. May return early: callers re-check what they wait for.
  virtual void WaitUntil(CondVar& cv, Mutex& mu, time_point deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // The process's steady clock (shared, stateless).
  static std::shared_ptr<Clock> Real();
};

// The wall clock: Unix milliseconds now; and one as "YYYY-MM-DD HH:MM:SS" (UTC), "-"
// for 0 or less.
int64_t UnixNowMs();
std::string UnixMsText(int64_t unix_ms);

// Seconds as a Clock duration (config values are doubles).
inline Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

class FakeClock final : public Clock {
 public:
  time_point Now() const override;
  // Waits are cut into real slices of a millisecond, so a waiter notices Advance()
  // within one slice; the time it sees moves only by Advance().
  void WaitUntil(CondVar& cv, Mutex& mu, time_point deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Advance(duration d);
  void AdvanceSeconds(double s) { Advance(Seconds(s)); }

 private:
  mutable Mutex mu_;
  time_point now_ ABSL_GUARDED_BY(mu_){std::chrono::hours(1)};
};

}  // namespace cleave
