// A fixed-size worker pool. Submit() never blocks; tasks run in FIFO order.
// The destructor finishes queued tasks and joins the workers. Thread-safe.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "core/mutex.h"

namespace cleave {

class ThreadPool {
 public:
  // `on_start`, if set, runs first on each worker (e.g. UseTorchThreads).
  explicit ThreadPool(int threads, std::function<void()> on_start = nullptr);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Submit(std::function<void()> task);
  int size() const { return static_cast<int>(workers_.size()); }
  // The calling thread's index in [0, size()) if it is one of this pool's workers,
  // else -1.
  int WorkerIndex() const;

 private:
  void Loop();

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace cleave
