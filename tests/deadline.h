// Real-time limits in tests, scaled for sanitizer builds. A limit that only guards
// against a hung call or process must not fail one that is merely slow: ThreadSanitizer
// slows gRPC's calls about 100x and training about 10x, AddressSanitizer both about 3x.
// (Deadlines the code under test enforces go through an injected clock instead.)
#pragma once

#include <chrono>

namespace cleave::testing {

constexpr int kSanitizerSlowdown =
#if defined(__SANITIZE_THREAD__)
    50;
#elif defined(__SANITIZE_ADDRESS__)
    4;
#else
    1;
#endif

// Memory bounds scale too: AddressSanitizer's shadow and quarantine and ThreadSanitizer's
// shadow make a process several times larger.
constexpr int kSanitizerMemory =
#if defined(__SANITIZE_THREAD__)
    5;
#elif defined(__SANITIZE_ADDRESS__)
    3;
#else
    1;
#endif

// `seconds` in a plain build, times the slowdown in a sanitized one.
constexpr int ScaledSeconds(int seconds) { return seconds * kSanitizerSlowdown; }

// A deadline for an RPC a test makes, `seconds` from now in a plain build.
inline std::chrono::system_clock::time_point RpcDeadline(int seconds) {
  return std::chrono::system_clock::now() + std::chrono::seconds(ScaledSeconds(seconds));
}

}  // namespace cleave::testing
