#include "core/thread_pool.h"

namespace cleave {

ThreadPool::ThreadPool(int threads, std::function<void()> on_start) {
  for (int i = 0; i < threads; ++i) {
    workers_.emplace_back([this, on_start] {
      if (on_start) on_start();
      Loop();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Submit(std::function<void()> task) {
  {
    MutexLock l(&mu_);
    queue_.push_back(std::move(task));
  }
  cv_.Signal();
}

void ThreadPool::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      MutexLock l(&mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace cleave
