#include "server/blob_store.h"

#include "absl/strings/str_cat.h"
#include "core/parameter_set.h"
#include "core/printable.h"

namespace cleave {

void BlobStore::Pin(const std::string& digest, std::shared_ptr<const std::string> blob) {
  blobs_[digest] = std::move(blob);
  pinned_.insert(digest);
}

BlobRef BlobStore::Pin(std::shared_ptr<const std::string> blob) {
  BlobRef ref{Sha256Hex(*blob), static_cast<int64_t>(blob->size())};
  Pin(ref.digest, std::move(blob));
  return ref;
}

void BlobStore::Add(const std::string& digest, std::shared_ptr<const std::string> blob,
                    int64_t fp32_size) {
  blobs_[digest] = std::move(blob);
  fp32_sizes_[digest] = fp32_size;
}

void BlobStore::PublishModel(const std::string& digest, std::shared_ptr<const std::string> blob,
                             int64_t fp32_size, int versions_kept) {
  models_.push_back(digest);
  while (static_cast<int>(models_.size()) > std::max(1, versions_kept)) models_.pop_front();
  std::set<std::string> kept = pinned_;
  kept.insert(models_.begin(), models_.end());
  for (auto it = blobs_.begin(); it != blobs_.end();) {
    it = kept.count(it->first) ? std::next(it) : blobs_.erase(it);
  }
  for (auto it = fp32_sizes_.begin(); it != fp32_sizes_.end();) {
    it = kept.count(it->first) ? std::next(it) : fp32_sizes_.erase(it);
  }
  blobs_[digest] = std::move(blob);
  fp32_sizes_[digest] = fp32_size;
}

StatusOr<BlobStore::Found> BlobStore::Find(const std::string& digest) const {
  auto b = blobs_.find(digest);
  if (b == blobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no blob ", Printable(digest), " (stale model version?)"));
  }
  auto f = fp32_sizes_.find(digest);
  return Found{b->second,
               f == fp32_sizes_.end() ? static_cast<int64_t>(b->second->size()) : f->second};
}

}  // namespace cleave
