// Connection admission at accept time, before gRPC sees a connection.
//
// gRPC 1.51 (Debian 12) has no cap on incoming connections, and after one accept4 that
// fails with EMFILE it stops accepting on that port for good: a burst of connections
// beyond the descriptor limit, faster than the handshake timeout closes them, would lock
// every client out of a running server. This file defines accept4 for the process (the
// executable's definition comes first in symbol lookup, so gRPC's listener calls it):
//   - at most `max_connections` accepted connections are open at once; one beyond is
//     closed at once (its client sees the connection reset and retries later);
//   - when descriptors run out anyway, the pending connection is taken off the queue with
//     a spare descriptor and closed, and gRPC is told to try again later (EAGAIN) instead
//     of seeing EMFILE, so the listener keeps accepting.
// Counting is exact: each admitted descriptor is remembered with its inode, and entries
// whose descriptor was closed (or reused for something else) are dropped when the count
// reaches the cap. Process-wide; until SetConnectionLimit is called nothing is capped.
#pragma once

#include <cstdint>

namespace cleave {

// Caps accepted connections at `max_connections` (> 0). Also reserves the spare
// descriptor. Safe to call again (the last call wins).
void SetConnectionLimit(int max_connections);

struct AcceptStats {
  int64_t admitted = 0;
  int64_t refused = 0;  // over the cap, or when descriptors ran out
  int open = 0;         // admitted connections still open (as of the last count)
};
AcceptStats GetAcceptStats();

}  // namespace cleave
