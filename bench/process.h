// What a benchmark measures of its own process: resident memory and CPU time.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace cleave {

// VmRSS from /proc/self/status, in bytes.
inline int64_t RssBytes() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmRSS:") {
      int64_t kb;
      f >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

// User and system CPU seconds of this process, every thread (getrusage).
struct CpuTime {
  double user = 0, system = 0;
  double total() const { return user + system; }
};
inline CpuTime ProcessCpu() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return {ru.ru_utime.tv_sec + 1e-6 * ru.ru_utime.tv_usec,
          ru.ru_stime.tv_sec + 1e-6 * ru.ru_stime.tv_usec};
}

}  // namespace cleave
