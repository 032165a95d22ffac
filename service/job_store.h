// The daemon's durable state (cleave-server --daemon --state-dir DIR): the jobs
// submitted, queued, running and ended, and the audit log of who submitted and cancelled
// what, in one SQLite database (DIR/jobs.db) written with full synchronous commits, so
// that a daemon stopped or killed at any point finds every accepted submission and
// every audit entry again. A job that was running when the daemon stopped is queued
// again on open; it resumes from its run directory's checkpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/mutex.h"
#include "core/status.h"

struct sqlite3;

namespace cleave {

enum class JobState { kQueued, kRunning, kSucceeded, kFailed, kCancelled };

// "queued", "running", "succeeded", "failed", "cancelled".
const char* JobStateName(JobState s);
bool JobEnded(JobState s);

// N of job id "job-N" (the submission's number); 0 for anything else.
int64_t JobNumber(const std::string& id);

struct JobRecord {
  std::string id;         // "job-N", N counting submissions from 1
  std::string name;       // the job's run.name
  std::string submitter;  // the identity that submitted it
  std::string digest;     // SHA-256 (hex) of its config text
  std::string config;     // the config text as submitted
  JobState state = JobState::kQueued;
  int64_t submitted_ms = 0, started_ms = 0, ended_ms = 0;  // Unix time; 0: not yet
  std::string reason;                                      // why it failed or was cancelled
  bool cancel_requested = false;  // a running job being stopped
  // Progress, as the runner last recorded it.
  int64_t committed_round = 0, total_rounds = 0;
  double accuracy = 0, loss = 0;
  bool evaluated = false;  // accuracy and loss were measured
  int priority = 0;  // run.priority: a higher one starts (and is scheduled) first
  // The clients that declined it or left it failing, and why (Get only; a client that
  // left it after its end has an empty reason).
  std::vector<std::pair<std::string, std::string>> declines;
  // When a running job is expected to end (Unix ms; Daemon's forecast, not stored); 0:
  // not known yet.
  int64_t expected_end_ms = 0;
};

struct AuditEntry {
  int64_t at_ms = 0;
  std::string who, action, job, digest, outcome;
};

class JobStore {
 public:
  // Opens or creates the database at `path`. At most `max_queued` jobs wait at once.
  // `now_ms` is the Unix time in milliseconds (the system clock unless given).
  static StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path, int max_queued,
                                                  std::function<int64_t()> now_ms = nullptr);
  ~JobStore();

  // A new queued job, with its audit entry, in one transaction. RESOURCE_EXHAUSTED when
  // max_queued jobs wait; ALREADY_EXISTS when a queued or running job has its name.
  StatusOr<JobRecord> Submit(const std::string& submitter, const std::string& name,
                             const std::string& config, int64_t total_rounds, int priority = 0);
  // NOT_FOUND for an unknown id.
  StatusOr<JobRecord> Get(const std::string& id) const;
  // Every job, in submission order.
  std::vector<JobRecord> List() const;
  // The queued job of the highest priority (the oldest of those), now running; NOT_FOUND
  // when none waits.
  StatusOr<JobRecord> StartNext();
  // A running job ended: succeeded, failed or cancelled, with `reason`.
  Status Finish(const std::string& id, JobState state, const std::string& reason);
  // `who` cancels job `id`: a queued job ends now, a running one is marked for the runner
  // to stop (cancel_requested); with its audit entry. FAILED_PRECONDITION for a job that
  // already ended, NOT_FOUND for an unknown id.
  StatusOr<JobRecord> Cancel(const std::string& id, const std::string& who);
  Status Progress(const std::string& id, int64_t committed_round, bool evaluated, double accuracy,
                  double loss);
  // Client `client` declined (or left) job `id` for `reason`; a later one replaces it.
  Status Decline(const std::string& id, const std::string& client, const std::string& reason);
  // An audit entry of its own (a refused request, say).
  Status Audit(const AuditEntry& e);
  std::vector<AuditEntry> AuditLog() const;

 private:
  JobStore(sqlite3* db, int max_queued, std::function<int64_t()> now_ms);
  Status Exec(const std::string& sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the columns a database made by an older daemon lacks.
  Status Migrate() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status AuditLocked(const AuditEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<JobRecord> Select(const std::string& where, const std::string& arg,
                                const std::string& order = "seq") const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
  const int max_queued_;
  const std::function<int64_t()> now_ms_;
};

}  // namespace cleave
