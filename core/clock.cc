#include "core/clock.h"

namespace cleave {
namespace {

class RealClock final : public Clock {
 public:
  time_point Now() const override { return std::chrono::steady_clock::now(); }
  void WaitUntil(CondVar& cv, Mutex& mu, time_point deadline) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (Now() >= deadline) return;
    cv.WaitUntil(&mu, deadline);
  }
};

}  // namespace

std::shared_ptr<Clock> Clock::Real() {
  static const auto* real = new std::shared_ptr<Clock>(std::make_shared<RealClock>());
  return *real;
}

Clock::time_point FakeClock::Now() const {
  MutexLock l(&mu_);
  return now_;
}

void FakeClock::WaitUntil(CondVar& cv, Mutex& mu, time_point deadline) const {
  if (Now() >= deadline) return;
  cv.WaitUntil(&mu, std::chrono::steady_clock::now() + std::chrono::milliseconds(1));
}

void FakeClock::Advance(duration d) {
  MutexLock l(&mu_);
  now_ += d;
}

}  // namespace cleave
