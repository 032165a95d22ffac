#include "client/shared.h"

#include <algorithm>

#include "models/model.h"

namespace cleave {

TaskSlots::TaskSlots(int n) {
  for (int i = 0; i < std::max(1, n); ++i) workers_.emplace_back([this] { Loop(); });
}

TaskSlots::~TaskSlots() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void TaskSlots::Loop() {
  UseTorchThreads();
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    work_cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    Job* job = queue_.front();
    queue_.pop_front();
    l.unlock();
    (*job->task)();
    l.lock();
    job->done = true;
    done_cv_.notify_all();
  }
}

bool TaskSlots::Run(const std::function<void()>& task, const std::atomic<bool>& stop) {
  Job job{&task};
  std::unique_lock<std::mutex> l(mu_);
  if (stop) return false;
  queue_.push_back(&job);
  work_cv_.notify_one();
  done_cv_.wait(l, [&] { return job.done || stop; });
  if (job.done) return true;
  auto it = std::find(queue_.begin(), queue_.end(), &job);
  if (it != queue_.end()) {  // stopped while queued: it never runs
    queue_.erase(it);
    return false;
  }
  done_cv_.wait(l, [&] { return job.done; });  // already running: it ends on its own
  return true;
}

void TaskSlots::WakeAll() {
  { std::lock_guard<std::mutex> l(mu_); }  // a waiter between its check and its wait sees it
  done_cv_.notify_all();
}

Heartbeats::Heartbeats() : thread_([this] { Loop(); }) {}

Heartbeats::~Heartbeats() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

int64_t Heartbeats::Add(std::chrono::milliseconds period, std::function<bool()> beat) {
  std::lock_guard<std::mutex> l(mu_);
  const int64_t id = next_id_++;
  const Time now = std::chrono::steady_clock::now();
  entries_[id] = Entry{period, std::move(beat), now};
  due_.emplace(now, id);
  cv_.notify_all();
  return id;
}

void Heartbeats::Remove(int64_t id) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return running_ != id; });
  entries_.erase(id);
}

void Heartbeats::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stopping_) {
    if (due_.empty()) {
      cv_.wait(l);
      continue;
    }
    const auto [when, id] = *due_.begin();
    if (std::chrono::steady_clock::now() < when) {
      cv_.wait_until(l, when);
      continue;
    }
    due_.erase(due_.begin());
    auto it = entries_.find(id);
    if (it == entries_.end() || it->second.next != when) continue;  // removed or stale
    running_ = id;
    // Remove waits while `id` runs, and map entries stay put when others are added: the
    // beat is called in place, without a copy per beat.
    const std::function<bool()>& beat = it->second.beat;
    l.unlock();
    const bool again = beat();
    l.lock();
    running_ = 0;
    cv_.notify_all();
    it = entries_.find(id);
    if (it == entries_.end()) continue;
    if (!again) {
      entries_.erase(it);
      continue;
    }
    it->second.next = when + it->second.period;
    due_.emplace(it->second.next, id);
  }
}

}  // namespace cleave
