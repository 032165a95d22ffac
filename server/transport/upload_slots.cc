#include "server/transport/upload_slots.h"

#include <algorithm>

#include "core/printable.h"
#include "server/transport/transport.h"
#include "spdlog/spdlog.h"

namespace cleave {

void UploadSlots::Register(std::shared_ptr<UploadCall> r) {
  MutexLock l(&mu_);
  open_[r.get()] = std::move(r);
}

void UploadSlots::Unregister(UploadCall* r) {
  MutexLock l(&mu_);
  open_.erase(r);
  if (const v1::UploadHeader* h = r->header()) {
    auto it = of_client_.find(h->client_id());
    if (it != of_client_.end() && it->second == r) of_client_.erase(it);
  }
}

bool UploadSlots::Claim(const std::string& client_id, UploadCall* r) {
  std::shared_ptr<UploadCall> older;
  bool has_slot = false;
  {
    MutexLock l(&mu_);
    UploadCall*& current = of_client_[client_id];
    if (current != nullptr && current != r) {
      auto it = open_.find(current);
      if (it != open_.end()) older = it->second;
    }
    current = r;
    if (free_ > 0) {
      --free_;
      r->has_slot = has_slot = true;
      r->Granted();
    } else {
      r->Queue();
      waiters_.push_back(r);
    }
  }
  if (older) {  // without mu_: cancelling may run the call's OnCancel inline
    spdlog::warn("client {} opened a second upload; cancelling its older one",
                 Printable(client_id));
    older->Cancel();
  }
  return has_slot;
}

bool UploadSlots::CancelWaiting(UploadCall* r) {
  MutexLock l(&mu_);
  auto it = std::find(waiters_.begin(), waiters_.end(), r);
  if (it == waiters_.end()) return false;
  waiters_.erase(it);
  return true;
}

void UploadSlots::Release() {
  UploadCall* next = nullptr;
  {
    MutexLock l(&mu_);
    if (waiters_.empty()) {
      ++free_;
      return;
    }
    next = waiters_.front();  // the slot passes straight to the next upload
    waiters_.pop_front();
    next->has_slot = true;
    next->Granted();
  }
  next->Resume();
}

void UploadSlots::CancelAll() {
  std::vector<std::shared_ptr<UploadCall>> open;
  {
    MutexLock l(&mu_);
    for (auto& [p, r] : open_) open.push_back(r);
  }
  // Without mu_: cancellation may run OnCancel inline, which takes it.
  for (auto& r : open) r->Cancel();
}

std::vector<std::shared_ptr<UploadCall>> UploadSlots::ExpireIdle(Clock::duration limit,
                                                                 Clock::time_point now) {
  std::vector<std::shared_ptr<UploadCall>> stalled;
  MutexLock l(&mu_);
  for (auto& [p, r] : open_) {
    if (r->ExpireIfIdle(limit, now)) stalled.push_back(r);
  }
  return stalled;
}

UploadSlots::Counts UploadSlots::counts() const {
  MutexLock l(&mu_);
  return {static_cast<int>(of_client_.size()), static_cast<int>(waiters_.size())};
}

}  // namespace cleave
