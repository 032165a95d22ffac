// What the coordinator needs of a transport: a client's control stream (ClientLink) and
// an upload in progress (UploadCall). server/transport/rpc.cc implements both over gRPC; tests
// implement them in memory (tests/server/fake_transport.h), so the coordinator runs the
// same rounds with or without sockets. Neither interface holds a gRPC type.
#pragma once

#include "cleave/v1/cleave.pb.h"
#include "core/clock.h"
#include "core/status.h"

namespace cleave {

// A client's control stream as the coordinator sees it. Never called with the
// coordinator's mutex held (a transport may run callbacks inline).
class ClientLink {
 public:
  virtual ~ClientLink() = default;
  // Queues `msg`; false if the stream is closing. finish_after: the stream ends OK once
  // it is written.
  virtual bool Send(v1::ServerMessage msg, bool finish_after = false) = 0;
  // Ends the stream with `why` once the messages already queued are written.
  virtual void Close(const Status& why) = 0;
};

// An upload in progress, as the upload slots (server/transport/upload_slots.h) and expiry see it.
class UploadCall {
 public:
  virtual ~UploadCall() = default;
  // The header, once it passed CheckUploadHeader (then it stays unchanged); else null.
  virtual const v1::UploadHeader* header() const = 0;
  // Cancels the call if it is still receiving data. Any thread, no coordinator lock.
  virtual void Cancel() = 0;
  // True, once, when the call has waited for its client longer than `limit` (the time
  // it spends queued for an upload slot does not count).
  virtual bool ExpireIfIdle(Clock::duration limit, Clock::time_point now) = 0;
  // Called under the upload slots' mutex when the call queues for a slot, and when it
  // gets one.
  virtual void Queue() = 0;
  virtual void Granted() = 0;
  // Called without locks when a queued call got its slot: it may read its payload now.
  virtual void Resume() = 0;
  bool has_slot = false;  // written by UploadSlots under its mutex
};

}  // namespace cleave
