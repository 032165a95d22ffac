// Decoders of files nobody vetted, run as an attacker's file would meet them: in a child
// process whose memory is capped (setrlimit), so that an allocation past the cap fails
// there instead of swapping the machine. The parent asserts how the child ended: a
// signal (std::bad_alloc escaping, a segfault, an abort) fails the test; a clear error
// comes back as the child's Status. Only for code without threads of its own (fork).
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace cleave::testing {

// How `fn` ended in a child whose address space may grow `cap_bytes` past its size now:
// its Status (code and message), or an INTERNAL status naming the signal or exit code.
inline Status UnderMemoryCap(int64_t cap_bytes, const std::function<Status()>& fn) {
  int64_t vm = 0;  // the address space now (VmSize): the cap is counted from it
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmSize:", 0) == 0) {
      int64_t kb = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(7, line.size() - 10)), &kb)) vm = kb * 1024;
    }
  }
  int fds[2];
  if (::pipe(fds) != 0) return absl::InternalError("pipe");
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError("fork");
  if (pid == 0) {
    ::close(fds[0]);
    struct rlimit r {};
    r.rlim_cur = r.rlim_max = static_cast<rlim_t>(vm + cap_bytes);
    ::setrlimit(RLIMIT_AS, &r);
    const Status s = fn();
    const std::string out = absl::StrCat(static_cast<int>(s.code()), " ", s.message());
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int wstatus = 0;
  ::waitpid(pid, &wstatus, 0);
  if (WIFSIGNALED(wstatus)) return absl::InternalError(absl::StrCat("the child died of signal ", WTERMSIG(wstatus)));
  if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0 || got.empty()) {
    return absl::InternalError(absl::StrCat("the child exited with ", WEXITSTATUS(wstatus)));
  }
  const size_t space = got.find(' ');
  int code = 0;
  if (space == std::string::npos || !absl::SimpleAtoi(got.substr(0, space), &code)) {
    return absl::InternalError("the child said " + got);
  }
  return Status(static_cast<absl::StatusCode>(code), got.substr(space + 1));
}

}  // namespace cleave::testing
