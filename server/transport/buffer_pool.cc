#include "server/transport/buffer_pool.h"

#include <utility>

namespace cleave {

std::string BufferPool::Take(int64_t size) {
  std::string b;
  {
    MutexLock l(&mu_);
    if (!buffers_.empty()) {
      b = std::move(buffers_.back());
      buffers_.pop_back();
    }
  }
  b.clear();
  b.reserve(size);
  return b;
}

void BufferPool::Return(std::string buffer) {
  MutexLock l(&mu_);
  if (static_cast<int>(buffers_.size()) < keep_) buffers_.push_back(std::move(buffer));
}

void BufferPool::Drop() {
  std::vector<std::string> drop;  // freed after the lock
  MutexLock l(&mu_);
  drop.swap(buffers_);
}

int BufferPool::pooled() const {
  MutexLock l(&mu_);
  return static_cast<int>(buffers_.size());
}

}  // namespace cleave
