#include "core/clock.h"

#include "absl/time/time.h"

namespace cleave {
namespace {

class RealClock final : public Clock {
 public:
  time_point Now() const override { return std::chrono::steady_clock::now(); }
  void WaitUntil(absl::CondVar& cv, absl::Mutex& mu, time_point deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const auto left = deadline - Now();
    if (left <= duration::zero()) return;
    cv.WaitWithTimeout(&mu, absl::FromChrono(left));
  }
};

}  // namespace

std::shared_ptr<Clock> Clock::Real() {
  static const auto* real = new std::shared_ptr<Clock>(std::make_shared<RealClock>());
  return *real;
}

Clock::time_point FakeClock::Now() const {
  absl::MutexLock l(&mu_);
  return now_;
}

void FakeClock::WaitUntil(absl::CondVar& cv, absl::Mutex& mu, time_point deadline) const {
  if (Now() >= deadline) return;
  cv.WaitWithTimeout(&mu, absl::Milliseconds(1));
}

void FakeClock::Advance(duration d) {
  absl::MutexLock l(&mu_);
  now_ += d;
}

}  // namespace cleave
