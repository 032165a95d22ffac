// What the virtual clients of a simulation share: task workers and one heartbeat thread.
#include "client/shared.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace cleave {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Each task waits until as many run as the slots allow (or all others are done), so a
// pool that let more run at once would be seen doing it.
TEST(TaskSlotsTest, RunsEveryTaskAndNoMoreAtOnceThanItHasSlots) {
  constexpr int kSlots = 2, kTasks = 8;
  TaskSlots slots(kSlots);
  std::mutex mu;
  std::condition_variable cv;
  int active = 0, finished = 0, most = 0;
  std::atomic<bool> stop{false};
  std::vector<std::thread> callers;
  std::atomic<int> ran{0};
  for (int i = 0; i < kTasks; ++i) {
    callers.emplace_back([&] {
      const bool ok = slots.Run(
          [&] {
            std::unique_lock<std::mutex> l(mu);
            most = std::max(most, ++active);
            cv.notify_all();
            cv.wait_for(l, seconds(10),
                        [&] { return active >= kSlots || finished + active == kTasks; });
            --active;
            ++finished;
            cv.notify_all();
            ++ran;
          },
          stop);
      EXPECT_TRUE(ok);
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(ran, kTasks);
  EXPECT_EQ(most, kSlots);
}

TEST(TaskSlotsTest, AStoppedCallerWaitingForASlotReturnsWithoutRunning) {
  TaskSlots slots(1);
  std::mutex mu;
  std::condition_variable cv;
  bool started = false, release = false;
  std::atomic<bool> no_stop{false}, stop{false}, second_ran{false};
  std::thread first([&] {
    slots.Run(
        [&] {
          std::unique_lock<std::mutex> l(mu);
          started = true;
          cv.notify_all();
          cv.wait(l, [&] { return release; });
        },
        no_stop);
  });
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return started; });
  }
  bool second_ok = true;
  std::thread second([&] { second_ok = slots.Run([&] { second_ran = true; }, stop); });
  stop = true;
  slots.WakeAll();
  second.join();  // returns while the only slot is still busy
  EXPECT_FALSE(second_ok);
  {
    std::lock_guard<std::mutex> l(mu);
    release = true;
  }
  cv.notify_all();
  first.join();
  EXPECT_FALSE(second_ran);
}

TEST(HeartbeatsTest, BeatsUntilTheBeatSaysStopOrItIsRemoved) {
  Heartbeats beats;
  std::mutex mu;
  std::condition_variable cv;
  int a = 0, b = 0, c = 0;
  auto counter = [&](int* n, int stop_after) {
    return [&, n, stop_after] {
      std::lock_guard<std::mutex> l(mu);
      ++*n;
      cv.notify_all();
      return *n < stop_after;
    };
  };
  const int64_t id_a = beats.Add(milliseconds(1), counter(&a, 1000000));
  beats.Add(milliseconds(1), counter(&b, 1000000));
  beats.Add(milliseconds(1), counter(&c, 3));  // says stop at its third beat
  std::unique_lock<std::mutex> l(mu);
  ASSERT_TRUE(cv.wait_for(l, seconds(10), [&] { return a >= 3 && b >= 3 && c >= 3; }));
  l.unlock();
  beats.Remove(id_a);
  l.lock();
  const int a_removed = a, b_then = b;
  ASSERT_TRUE(cv.wait_for(l, seconds(10), [&] { return b >= b_then + 5; }));
  EXPECT_EQ(a, a_removed) << "a removed beat ran again";
  EXPECT_EQ(c, 3) << "a beat that returned false ran again";
}

}  // namespace
}  // namespace cleave
