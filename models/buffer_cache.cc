// SetTorchBufferCache (models/model.h): a c10::Allocator in front of LibTorch's default
// CPU allocator that keeps large freed buffers for reuse by exact size.
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "models/model.h"

namespace cleave {
namespace {

class BufferCache final : public c10::Allocator {
 public:
  // Smaller buffers go to the default allocator: glibc's heap serves them without fresh
  // pages each time.
  static constexpr size_t kMinBytes = size_t{16} << 20;
  static constexpr size_t kAlignment = 64;  // as c10's own CPU allocator

  static BufferCache& Get() {
    static BufferCache* cache = new BufferCache();  // never destroyed: tensors outlive statics
    return *cache;
  }

  c10::DataPtr allocate(size_t n) const override {
    if (n < kMinBytes) return base_->allocate(n);
    const size_t size = (n + 4095) & ~size_t{4095};
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = free_.find(size);
      if (it != free_.end()) {
        p = it->second.back();
        it->second.pop_back();
        if (it->second.empty()) free_.erase(it);
        cached_ -= size;
      }
    }
    if (p == nullptr) {
      p = std::aligned_alloc(kAlignment, size);
      if (p == nullptr) throw std::bad_alloc();
      std::lock_guard<std::mutex> l(mu_);
      sizes_[p] = size;
    }
    return {p, p, &Release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Release; }

  void SetMax(size_t max) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> l(mu_);
      max_ = max;
      while (cached_ > max_ && !free_.empty()) {
        auto it = std::prev(free_.end());  // the largest first
        for (void* p : it->second) {
          drop.push_back(p);
          sizes_.erase(p);
          cached_ -= it->first;
        }
        free_.erase(it);
      }
    }
    for (void* p : drop) std::free(p);
  }

 private:
  static void Release(void* p) {
    BufferCache& c = Get();
    std::unique_lock<std::mutex> l(c.mu_);
    auto it = c.sizes_.find(p);
    if (it == c.sizes_.end()) {  // raw-allocated before the cache was installed
      l.unlock();
      c.base_->raw_deleter()(p);
      return;
    }
    const size_t size = it->second;
    if (c.cached_ + size > c.max_) {
      c.sizes_.erase(it);
      l.unlock();
      std::free(p);
      return;
    }
    c.free_[size].push_back(p);
    c.cached_ += size;
  }

  c10::Allocator* const base_ = c10::GetDefaultCPUAllocator();
  mutable std::mutex mu_;
  mutable std::unordered_map<void*, size_t> sizes_;        // every buffer of ours, live or cached
  mutable std::map<size_t, std::vector<void*>> free_;      // cached, by size
  mutable size_t cached_ = 0;
  size_t max_ = 0;
};

std::atomic<bool> g_cache_set{false};

}  // namespace

void SetDefaultTorchBufferCache() {
  if (!g_cache_set) SetTorchBufferCache(kTorchBufferCacheBytes);
}

void SetTorchBufferCache(int64_t max_cached_bytes) {
  g_cache_set = true;
  static std::once_flag installed;
  BufferCache& cache = BufferCache::Get();
  cache.SetMax(static_cast<size_t>(std::max<int64_t>(0, max_cached_bytes)));
  std::call_once(installed, [&] { c10::SetCPUAllocator(&cache, /*priority=*/1); });
}

}  // namespace cleave
