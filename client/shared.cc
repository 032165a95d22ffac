#include "client/shared.h"

#include <algorithm>

#include "models/model.h"

namespace cleave {

TaskSlots::TaskSlots(int n) {
  for (int i = 0; i < std::max(1, n); ++i) workers_.emplace_back([this] { Loop(); });
}

TaskSlots::~TaskSlots() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
  }
  work_cv_.SignalAll();
  for (auto& w : workers_) w.join();
}

void TaskSlots::Loop() {
  UseTorchThreads();
  mu_.Lock();
  for (;;) {
    while (!stopping_ && queue_.empty()) work_cv_.Wait(&mu_);
    if (queue_.empty()) break;
    Job* job = queue_.front();
    queue_.pop_front();
    mu_.Unlock();
    (*job->task)();
    mu_.Lock();
    job->done = true;
    done_cv_.SignalAll();
  }
  mu_.Unlock();
}

bool TaskSlots::Run(const std::function<void()>& task, const std::atomic<bool>& stop) {
  Job job{&task};
  MutexLock l(&mu_);
  if (stop) return false;
  queue_.push_back(&job);
  work_cv_.Signal();
  while (!job.done && !stop) done_cv_.Wait(&mu_);
  if (job.done) return true;
  auto it = std::find(queue_.begin(), queue_.end(), &job);
  if (it != queue_.end()) {  // stopped while queued: it never runs
    queue_.erase(it);
    return false;
  }
  while (!job.done) done_cv_.Wait(&mu_);  // already running: it ends on its own
  return true;
}

void TaskSlots::WakeAll() {
  { MutexLock l(&mu_); }  // a waiter between its check and its wait sees it
  done_cv_.SignalAll();
}

Heartbeats::Heartbeats() : thread_([this] { Loop(); }) {}

Heartbeats::~Heartbeats() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

int64_t Heartbeats::Add(std::chrono::milliseconds period, std::function<bool()> beat) {
  MutexLock l(&mu_);
  const int64_t id = next_id_++;
  const Time now = std::chrono::steady_clock::now();
  entries_[id] = Entry{period, std::move(beat), now};
  due_.emplace(now, id);
  cv_.SignalAll();
  return id;
}

void Heartbeats::Remove(int64_t id) {
  MutexLock l(&mu_);
  while (running_ == id) cv_.Wait(&mu_);
  entries_.erase(id);
}

void Heartbeats::Loop() {
  mu_.Lock();
  while (!stopping_) {
    if (due_.empty()) {
      cv_.Wait(&mu_);
      continue;
    }
    const auto [when, id] = *due_.begin();
    if (std::chrono::steady_clock::now() < when) {
      cv_.WaitUntil(&mu_, when);
      continue;
    }
    due_.erase(due_.begin());
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.next != when) continue;  // removed or stale
    running_ = id;
    // Remove waits while `id` runs, and map entries stay put when others are added: the
    // beat is called in place, without a copy per beat.
    const std::function<bool()>& beat = it->second.beat;
    mu_.Unlock();
    const bool again = beat();
    mu_.Lock();
    running_ = 0;
    cv_.SignalAll();
    it = entries_.find(id);
    if (it == entries_.end()) continue;
    if (!again) {
      entries_.erase(it);
      continue;
    }
    it->second.next = when + it->second.period;
    due_.emplace(it->second.next, id);
  }
  mu_.Unlock();
}

}  // namespace cleave
