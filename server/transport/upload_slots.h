// UploadSlots: admission of uploads to the server's memory. At most `slots` uploads
// (server.worker_threads) read their payload at once; the others wait in arrival order
// and a freed slot passes straight to the next, so the server holds at most `slots`
// payloads however many clients upload together. A client has one upload in progress: a
// newer one cancels the older. Every open upload is known, so a closing round can
// cancel them and expiry can find the stalled ones.
//
// Thread-safe. No method calls UploadCall::Cancel or Resume with its mutex held (a
// transport may run its cancellation inline, which calls back in here).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/clock.h"
#include "core/mutex.h"

namespace cleave {

class UploadCall;  // server/transport/transport.h

class UploadSlots {
 public:
  explicit UploadSlots(int slots) : free_(slots) {}

  // An upload call opened (before its header is known).
  void Register(std::shared_ptr<UploadCall> r);
  // It ended: forgotten, and no longer its client's upload in progress.
  void Unregister(UploadCall* r);
  // `r`, whose header passed, becomes `client_id`'s one upload in progress (an older one
  // still open is cancelled) and asks for a slot: true if it may read its payload now;
  // otherwise it is queued (UploadCall::Queue) and resumed when a slot frees.
  bool Claim(const std::string& client_id, UploadCall* r);
  // Removes a queued `r`; true if it was queued.
  bool CancelWaiting(UploadCall* r);
  // Called once by each call that held a slot: the slot passes to the next queued call
  // (Granted, then Resume without the mutex), or becomes free.
  void Release();
  // Cancels every open upload (a round closed).
  void CancelAll();
  // The open uploads that waited for their client longer than `limit` at `now` (each
  // reported once, UploadCall::ExpireIfIdle).
  std::vector<std::shared_ptr<UploadCall>> ExpireIdle(Clock::duration limit, Clock::time_point now);

  struct Counts {
    int in_progress = 0;  // clients with an upload claimed
    int waiting = 0;      // calls queued for a slot
  };
  Counts counts() const;

 private:
  mutable Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
  std::deque<UploadCall*> waiters_ ABSL_GUARDED_BY(mu_);
  std::map<UploadCall*, std::shared_ptr<UploadCall>> open_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, UploadCall*> of_client_ ABSL_GUARDED_BY(mu_);  // see Claim
};

}  // namespace cleave
