#include "server/transport/accept_gate.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <unordered_map>

#include "absl/base/thread_annotations.h"
#include "core/mutex.h"

namespace cleave {
namespace {

class Gate {
 public:
  void SetLimit(int max_connections) {
    MutexLock l(&mu_);
    max_ = max_connections;
    if (spare_ < 0) spare_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }

  AcceptStats Stats() {
    MutexLock l(&mu_);
    Prune();
    return {admitted_, refused_, static_cast<int>(open_.size())};
  }

  int Accept(int listener, sockaddr* addr, socklen_t* len, int flags) {
    while (true) {
      const int fd = static_cast<int>(syscall(SYS_accept4, listener, addr, len, flags));
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) return OutOfDescriptors(listener);
        return fd;
      }
      if (Admit(fd)) return fd;
      close(fd);  // over the cap: refuse it and look at the next one pending
    }
  }

 private:
  bool Admit(int fd) {
    MutexLock l(&mu_);
    if (max_ <= 0) return true;
    struct stat st {};
    if (fstat(fd, &st) != 0) return true;
    if (static_cast<int>(open_.size()) >= max_) Prune();
    if (static_cast<int>(open_.size()) >= max_) {
      ++refused_;
      return false;
    }
    open_[fd] = st.st_ino;  // a reused descriptor number replaces its stale entry
    ++admitted_;
    return true;
  }

  // Drops the entries whose descriptor no longer is the socket that was admitted.
  void Prune() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = open_.begin(); it != open_.end();) {
      struct stat st {};
      const bool same = fstat(it->first, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == it->second;
      it = same ? std::next(it) : open_.erase(it);
    }
  }

  // The process has no descriptor for the pending connection: free the spare, take the
  // connection off the queue, close it, take the spare back. The listener stays usable.
  int OutOfDescriptors(int listener) {
    MutexLock l(&mu_);
    ++refused_;
    if (spare_ >= 0) {
      close(spare_);
      const int fd = static_cast<int>(syscall(SYS_accept4, listener, nullptr, nullptr, SOCK_CLOEXEC));
      if (fd >= 0) close(fd);
      spare_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    errno = EAGAIN;  // gRPC waits for the listener to be readable again
    return -1;
  }

  Mutex mu_;
  int max_ ABSL_GUARDED_BY(mu_) = 0;
  int spare_ ABSL_GUARDED_BY(mu_) = -1;
  std::unordered_map<int, ino_t> open_ ABSL_GUARDED_BY(mu_);
  int64_t admitted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
};

Gate& TheGate() {
  static Gate* gate = new Gate;  // never destroyed: gRPC's pollers may accept at exit
  return *gate;
}

}  // namespace

void SetConnectionLimit(int max_connections) { TheGate().SetLimit(max_connections); }
AcceptStats GetAcceptStats() { return TheGate().Stats(); }

}  // namespace cleave

// Every accept4 of the process, gRPC's listeners' included (see accept_gate.h).
extern "C" int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  return cleave::TheGate().Accept(fd, addr, len, flags);
}
