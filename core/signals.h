// Turns SIGINT and SIGTERM into a call on an ordinary thread. The signal handler only
// writes a byte to a pipe (async-signal-safe), so `on_signal` may lock mutexes and call
// gRPC. Works whichever thread the kernel delivers the signal to (LibTorch and gRPC
// start threads of their own). One watcher per process.
#pragma once

#include <functional>
#include <thread>

namespace cleave {

class SignalWatcher {
 public:
  // Installs the handlers and starts the watching thread.
  explicit SignalWatcher(std::function<void(int signal)> on_signal);
  // Stops watching; runs nothing if no signal came.
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

 private:
  std::thread thread_;
};

}  // namespace cleave
