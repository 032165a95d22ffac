#include "core/signals.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

namespace cleave {
namespace {

int g_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!write(g_pipe[1], &b, 1);
  errno = saved;
}

}  // namespace

SignalWatcher::SignalWatcher(std::function<void(int)> on_signal) {
  if (pipe(g_pipe) != 0) return;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  thread_ = std::thread([on_signal = std::move(on_signal)] {
    for (;;) {
      unsigned char b = 0;
      const ssize_t n = read(g_pipe[0], &b, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || b == 0) return;  // 0: the destructor asks us to stop
      on_signal(b);
    }
  });
}

SignalWatcher::~SignalWatcher() {
  if (!thread_.joinable()) return;
  const unsigned char stop = 0;
  (void)!write(g_pipe[1], &stop, 1);
  thread_.join();
}

}  // namespace cleave
