// A mutex and condition variable that clang's thread-safety analysis checks and that
// ThreadSanitizer sees.
//
// absl::Mutex carries the same annotations, but Debian's Abseil is not built with TSan:
// a TSan build cannot see its synchronisation and reports every access made under it as
// a race. These wrap std::mutex and std::condition_variable (pthreads, which TSan
// intercepts) and keep absl's names and annotations, so the analysis
// (thread_safety.Coordinator) and `make test-tsan` check the same locks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace cleave {

class ABSL_LOCKABLE Mutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  // Tells the analysis that the caller holds it, where it cannot follow an alias (the
  // same mutex reached through another object); not checked at run time.
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

class CondVar {
 public:
  // Releases `mu` while blocked, holds it again on return. May wake spuriously.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    cv_.wait(l);
    l.release();
  }
  // As Wait, until signalled or `deadline`; true when it returned because the deadline
  // passed.
  bool WaitUntil(Mutex* mu, std::chrono::steady_clock::time_point deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(*mu) {
    std::unique_lock<std::mutex> l(mu->mu_, std::adopt_lock);
    const bool timed_out = cv_.wait_until(l, deadline) == std::cv_status::timeout;
    l.release();
    return timed_out;
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace cleave
