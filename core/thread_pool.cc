#include "core/thread_pool.h"

namespace cleave {
namespace {

// The pool the calling thread works for (null for other threads) and its index there.
thread_local const ThreadPool* current_pool = nullptr;
thread_local int current_index = -1;

}  // namespace

ThreadPool::ThreadPool(int threads, std::function<void()> on_start) {
  for (int i = 0; i < threads; ++i) {
    workers_.emplace_back([this, on_start, i] {
      current_pool = this;
      current_index = i;
      if (on_start) on_start();
      Loop();
    });
  }
}

int ThreadPool::WorkerIndex() const { return current_pool == this ? current_index : -1; }

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
