// This process's memory as the kernel counts it (/proc/self), for operators' metrics and
// for a device that keeps its work within --memory-limit-mb.
#pragma once

#include <cstdint>

namespace cleave {

// Resident memory now (VmRSS) and the most it has been (VmHWM), in bytes; 0 if unknown.
int64_t ResidentBytes();
int64_t PeakResidentBytes();
// The most memory this process could hold: the machine's physical memory, or less where
// an address-space or data limit (setrlimit, ulimit -v) says so.
int64_t MemoryCeilingBytes();

}  // namespace cleave
