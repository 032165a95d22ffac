#include "service/usage_ledger.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/files.h"

namespace cleave {

UsageLedger::UsageLedger(std::string path, const v1::SitePolicy& policy)
    : path_(std::move(path)),
      max_rounds_(policy.max_rounds_per_day()),
      max_seconds_(policy.max_training_hours_per_day() * 3600) {}

bool UsageLedger::Limits(const v1::SitePolicy& policy) {
  return policy.max_rounds_per_day() > 0 || policy.max_training_hours_per_day() > 0;
}

StatusOr<UsageLedger> UsageLedger::Open(const std::string& path, const v1::SitePolicy& policy) {
  UsageLedger ledger(path, policy);
  StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {  // absent: nothing trained yet; there but unreadable: no count to trust
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) return text.status();
    return ledger;
  }
  std::istringstream lines(*text);
  int n = 0;
  for (std::string line; std::getline(lines, line);) {
    ++n;
    if (line.empty()) continue;
    std::istringstream fields(line);
    int64_t end = 0;
    double seconds = 0;
    if (!(fields >> end >> seconds) || !std::isfinite(seconds) || seconds < 0 || end < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": not END_UNIX_MS SECONDS"));
    }
    ledger.tasks_.emplace_back(end, seconds);
  }
  std::sort(ledger.tasks_.begin(), ledger.tasks_.end());  // oldest first, as PausedAt reads them
  return ledger;
}

Status UsageLedger::Record(int64_t now_ms, double seconds) {
  tasks_.emplace_back(now_ms, std::isfinite(seconds) ? std::max(0.0, seconds) : 0.0);
  while (!tasks_.empty() && tasks_.front().first <= now_ms - kDayMs) tasks_.pop_front();
  if (path_.empty()) return absl::OkStatus();  // kept in memory only
  std::string text;
  for (const auto& [end, s] : tasks_) absl::StrAppend(&text, end, " ", s, "\n");
  return WriteFileAtomic(path_, text);
}

UsageLedger::Pause UsageLedger::PausedAt(int64_t now_ms) const {
  std::deque<std::pair<int64_t, double>> window;
  double seconds = 0;
  for (const auto& t : tasks_) {
    if (t.first > now_ms - kDayMs && t.first <= now_ms) {
      window.push_back(t);
      seconds += t.second;
    }
  }
  Pause p;
  // Train again once enough of the oldest tasks left the window: the count below the
  // limit, and the time below it.
  if (max_rounds_ > 0 && static_cast<int64_t>(window.size()) >= max_rounds_) {
    const auto& last_out = window[window.size() - static_cast<size_t>(max_rounds_)];
    p.until_ms = last_out.first + kDayMs;
    p.reason = absl::StrCat(window.size(), " tasks trained in 24 hours, its policy's max_rounds_per_day");
  }
  if (max_seconds_ > 0 && seconds >= max_seconds_) {
    double left = seconds;
    size_t i = 0;
    while (i < window.size() && left >= max_seconds_) left -= window[i++].second;
    const int64_t until = window[i - 1].first + kDayMs;
    if (until > p.until_ms) {
      p.until_ms = until;
      p.reason = absl::StrCat(seconds / 3600, " hours of training in 24 hours, its policy's max_training_hours_per_day");
    }
  }
  return p;
}

}  // namespace cleave
