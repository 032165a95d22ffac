// A site's training over the last 24 hours, against its policy's daily limits
// (max_rounds_per_day, max_training_hours_per_day in service/site_policy.h): each task
// the long-lived client trained, at the time it ended, with its training seconds. Kept in
// a file (one "END_UNIX_MS SECONDS" line per task) so that a restart does not reset it.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>

#include "cleave/v1/pool.pb.h"
#include "core/status.h"

namespace cleave {

class UsageLedger {
 public:
  // The ledger at `path` (absent: nothing trained yet; empty: kept in memory only) under
  // `policy`'s limits; a file that cannot be read, or lines that do not parse, are an
  // error naming the file (and line).
  static StatusOr<UsageLedger> Open(const std::string& path, const v1::SitePolicy& policy);
  // Whether the policy sets a daily limit at all.
  static bool Limits(const v1::SitePolicy& policy);

  // A task that ended at `now_ms` after `seconds` of training; the file is rewritten
  // with the last 24 hours.
  Status Record(int64_t now_ms, double seconds);

  struct Pause {
    int64_t until_ms = 0;  // 0: the site may train at the time asked
    std::string reason;
  };
  // Whether the limits let the site train at `now_ms`; if not, until when (the time the
  // oldest tasks leave the window enough for it to train again) and why.
  Pause PausedAt(int64_t now_ms) const;

  static constexpr int64_t kDayMs = 24 * 3600 * 1000;

 private:
  UsageLedger(std::string path, const v1::SitePolicy& policy);
  std::string path_;
  int64_t max_rounds_ = 0;
  double max_seconds_ = 0;
  std::deque<std::pair<int64_t, double>> tasks_;  // (end ms, seconds), oldest first
};

}  // namespace cleave
