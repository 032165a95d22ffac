// What the virtual clients of one process share (cleave simulate): workers that run their
// tasks, and one thread that sends their heartbeats. A process of thousands of clients
// then holds one waiting thread per client, and training state only on the workers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "core/mutex.h"

namespace cleave {

// `n` worker threads that run the tasks clients hand them, in FIFO order.
class TaskSlots {
 public:
  explicit TaskSlots(int n);
  ~TaskSlots();  // finishes the queued tasks
  TaskSlots(const TaskSlots&) = delete;
  TaskSlots& operator=(const TaskSlots&) = delete;

  // Runs `task` on a worker and waits for it to return. False, without running it, once
  // `stop` is true (the caller sets it, then calls WakeAll).
  bool Run(const std::function<void()>& task, const std::atomic<bool>& stop);
  void WakeAll();

 private:
  struct Job {
    const std::function<void()>* task;
    bool done = false;  // under mu_
  };
  void Loop();

  Mutex mu_;
  CondVar work_cv_, done_cv_;
  std::deque<Job*> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// One thread that calls each registered beat at its period.
class Heartbeats {
 public:
  Heartbeats();
  ~Heartbeats();
  Heartbeats(const Heartbeats&) = delete;
  Heartbeats& operator=(const Heartbeats&) = delete;

  // Calls `beat` now and then every `period` until it returns false or Remove(id).
  int64_t Add(std::chrono::milliseconds period, std::function<bool()> beat);
  // After it returns, `id`'s beat is not running and never runs again.
  void Remove(int64_t id);

 private:
  using Time = std::chrono::steady_clock::time_point;
  struct Entry {
    std::chrono::milliseconds period;
    std::function<bool()> beat;
    Time next;
  };
  void Loop();

  Mutex mu_;
  CondVar cv_;
  std::map<int64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  // may hold stale pairs: checked against entries_
  std::multimap<Time, int64_t> due_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;  // the id whose beat runs now (outside mu_), 0 = none
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace cleave
