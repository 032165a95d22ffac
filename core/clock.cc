#include "core/clock.h"

#include <ctime>

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

int64_t UnixNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string UnixMsText(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  const std::time_t t = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace cleave
