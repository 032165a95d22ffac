// The client's waits run on its injected clock (ClientOptions::clock).
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "client/client.h"

namespace cleave {
namespace {

// A server that never answers: the client backs off and gives up after
// give_up_after_s of its clock's time, which the test moves by hand.
TEST(ReconnectTest, GivesUpAfterItsClocksTimeNotTheWallsTime) {
  auto clock = std::make_shared<FakeClock>();
  ClientOptions o;
  o.server = "127.0.0.1:1";  // nothing listens on port 1
  o.insecure = true;
  o.name = "lonely";
  o.train.size = 1;
  o.train.bytes.assign(28 * 28, 0);
  o.train.labels = {0};
  o.give_up_after_s = 600;
  o.initial_backoff_s = 1;
  o.max_backoff_s = 60;
  o.clock = clock;
  Client client(o);
  Status result;
  std::atomic<bool> done{false};
  std::thread run([&] {
    result = client.Run();
    done = true;
  });
  // Steps of 30 s of the client's clock end its backoff sleeps (at most 1.5 x 60 s); it
  // gives up once 600 s of that clock passed, while the wall clock barely moves.
  const auto start = std::chrono::steady_clock::now();
  double advanced = 0;
  while (!done && std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    clock->AdvanceSeconds(30);
    advanced += 30;
  }
  if (!done) client.Stop();
  run.join();
  ASSERT_TRUE(done);
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable) << result;
  EXPECT_NE(result.message().find("unreachable for"), std::string::npos) << result;
  EXPECT_GE(advanced, 600) << "it gave up before its clock reached give_up_after_s";
}

}  // namespace
}  // namespace cleave
