// BlobStore: what devices fetch by digest (Fetch), one of the coordinator's components.
// Three lifetimes:
//   pinned   for the whole run: a TorchScript archive and loss, a frozen or quantized
//            base, the profiling probe;
//   models   the newest model versions, as many as tasks may still fetch
//            (RoundScheduler::VersionsKept: 1 for synchronous rounds);
//   a round's  blobs added for one round (split learning's client parts): gone when the
//            next model is published.
// Each blob has the size its fp32 encoding would take (compression ratios); by default
// its own. Not thread-safe: the coordinator's mutex guards it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "core/status.h"

namespace cleave {

// A blob as tasks name it: its digest (SHA-256, hex) and size in bytes; empty: none.
struct BlobRef {
  std::string digest;
  int64_t size = 0;
};

class BlobStore {
 public:
  struct Found {
    std::shared_ptr<const std::string> blob;
    int64_t fp32_size = 0;
  };

  // Keeps `blob` under `digest` for the whole run.
  void Pin(const std::string& digest, std::shared_ptr<const std::string> blob);
  // Keeps `blob` for the whole run under its own digest, which it returns with its size.
  BlobRef Pin(std::shared_ptr<const std::string> blob);
  // Keeps `blob` until the next model is published.
  void Add(const std::string& digest, std::shared_ptr<const std::string> blob, int64_t fp32_size);
  // Model version `digest`: kept with the `versions_kept - 1` newest before it; every
  // other blob but the pinned ones is dropped.
  void PublishModel(const std::string& digest, std::shared_ptr<const std::string> blob,
                    int64_t fp32_size, int versions_kept);
  // NOT_FOUND naming the digest (a stale model version, a part of a closed round).
  StatusOr<Found> Find(const std::string& digest) const;
  bool Has(const std::string& digest) const { return blobs_.count(digest) > 0; }
  size_t size() const { return blobs_.size(); }

 private:
  std::map<std::string, std::shared_ptr<const std::string>> blobs_;
  std::map<std::string, int64_t> fp32_sizes_;  // where it is not the blob's own size
  std::set<std::string> pinned_;
  std::deque<std::string> models_;  // newest last
};

}  // namespace cleave
