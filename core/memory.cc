#include "core/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace cleave {
namespace {

int64_t StatusBytes(const std::string& field) {  // a "Name:  N kB" line of /proc/self/status
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.compare(0, field.size(), field) == 0) return std::stoll(line.substr(field.size())) * 1024;
  }
  return 0;
}

}  // namespace

int64_t ResidentBytes() { return StatusBytes("VmRSS:"); }
int64_t PeakResidentBytes() { return StatusBytes("VmHWM:"); }

int64_t MemoryCeilingBytes() {
  int64_t ceiling = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  for (int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    struct rlimit r {};
    if (::getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
      ceiling = std::min<int64_t>(ceiling, static_cast<int64_t>(r.rlim_cur));
    }
  }
  return ceiling;
}

}  // namespace cleave
