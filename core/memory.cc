#include "core/memory.h"

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

}  // namespace cleave
