// A test fixture with a real server on a free loopback port, run on its own thread.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <chrono>
#include <thread>

#include "core/clock.h"
#include "server/server.h"

namespace cleave {

class RunningServerTest : public ::testing::Test {
 protected:
  // Creates and starts the server (listening on 127.0.0.1:0, evaluation off) and runs
  // it on runner_; Run's status lands in run_status_. Without a clock of the test's own
  // the server gets a FakeClock nobody moves: no deadline or timeout passes unless a test
  // says so, however slowly the machine (or a sanitizer) runs.
  void StartServerWith(ServerOptions o) {
    o.listen = "127.0.0.1:0";
    if (!o.clock) o.clock = std::make_shared<FakeClock>();
    o.evaluate = false;
    if (o.config.tls.cert.empty()) o.insecure = true;
    auto s = Server::Create(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    ASSERT_TRUE(server_->Start().ok());
    address_ = "127.0.0.1:" + std::to_string(server_->port());
    runner_ = std::thread([this] { run_status_ = server_->Run(); });
  }

  // Waits (up to a minute of real time) until the server holds exactly these uploads:
  // what a test checks before it moves a FakeClock past a timeout.
  ::testing::AssertionResult WaitForUploads(int in_progress, int queued) {
    Server::UploadCounts u;
    for (int i = 0; i < 6000; ++i) {
      u = server_->Uploads();
      if (u.in_progress == in_progress && u.queued == queued) return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return ::testing::AssertionFailure() << "uploads in progress " << u.in_progress << ", queued "
                                         << u.queued << "; expected " << in_progress << ", "
                                         << queued;
  }

  void TearDown() override {
    if (server_) server_->Stop();
    if (runner_.joinable()) runner_.join();
  }

  std::unique_ptr<Server> server_;
  std::string address_;
  std::thread runner_;
  Status run_status_;
};

}  // namespace cleave
