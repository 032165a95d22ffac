// BufferPool: upload payload buffers, reused across the uploads of a round. At most
// `keep` buffers wait in the pool (server.worker_threads: as many as uploads read their
// payload at once); a fresh multi-MiB buffer per upload costs its page faults and zeroing,
// about a sixth of the server's CPU with 100 clients. The coordinator empties it when a
// round closes (before the next model is built beside the current one) and when the run
// ends. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/mutex.h"

namespace cleave {

class BufferPool {
 public:
  explicit BufferPool(int keep) : keep_(keep) {}

  // An empty buffer with room for `size` bytes: a pooled one when there is one.
  std::string Take(int64_t size);
  // `buffer` back into the pool, unless it holds `keep` already.
  void Return(std::string buffer);
  // Frees every pooled buffer.
  void Drop();
  int pooled() const;

 private:
  const int keep_;
  mutable Mutex mu_;
  std::vector<std::string> buffers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cleave
