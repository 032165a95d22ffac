#include "service/job_store.h"

#include <spdlog/spdlog.h>

#include <sqlite3.h>

#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/parameter_set.h"
#include "core/clock.h"
#include "core/printable.h"

namespace cleave {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs(
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL, submitter TEXT NOT NULL, digest TEXT NOT NULL, config TEXT NOT NULL,
  state TEXT NOT NULL, submitted_ms INTEGER NOT NULL, started_ms INTEGER NOT NULL DEFAULT 0,
  ended_ms INTEGER NOT NULL DEFAULT 0, reason TEXT NOT NULL DEFAULT '',
  cancel_requested INTEGER NOT NULL DEFAULT 0, committed_round INTEGER NOT NULL DEFAULT 0,
  total_rounds INTEGER NOT NULL DEFAULT 0, evaluated INTEGER NOT NULL DEFAULT 0,
  accuracy REAL NOT NULL DEFAULT 0, loss REAL NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS audit(
  seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL, who TEXT NOT NULL,
  action TEXT NOT NULL, job TEXT NOT NULL, digest TEXT NOT NULL, outcome TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS declines(
  seq INTEGER NOT NULL, client TEXT NOT NULL, reason TEXT NOT NULL, at_ms INTEGER NOT NULL,
  PRIMARY KEY(seq, client));
)sql";

constexpr const char* kColumns =
    "seq, name, submitter, digest, config, state, submitted_ms, started_ms, ended_ms, reason, "
    "cancel_requested, committed_round, total_rounds, evaluated, accuracy, loss, priority";

constexpr JobState kStates[] = {JobState::kQueued, JobState::kRunning, JobState::kSucceeded,
                                JobState::kFailed, JobState::kCancelled};

JobState StateNamed(const std::string& name) {
  for (JobState s : kStates) {
    if (name == JobStateName(s)) return s;
  }
  return JobState::kFailed;
}

// One prepared statement; its parameters bound in order from 1.
class Stmt {
 public:
  Stmt(sqlite3* db, const std::string& sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql.c_str(), -1, &s_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& Bind(const std::string& v) {
    if (rc_ == SQLITE_OK) rc_ = sqlite3_bind_text(s_, ++n_, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Bind(int64_t v) {
    if (rc_ == SQLITE_OK) rc_ = sqlite3_bind_int64(s_, ++n_, v);
    return *this;
  }
  Stmt& Bind(double v) {
    if (rc_ == SQLITE_OK) rc_ = sqlite3_bind_double(s_, ++n_, v);
    return *this;
  }
  // The next row: true while there is one; an error status ends it.
  StatusOr<bool> Next() {
    if (rc_ != SQLITE_OK) return Failed();
    const int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    rc_ = rc;
    return Failed();
  }
  Status Run() { return Next().status(); }
  std::string Text(int col) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s_, col));
    return p == nullptr ? "" : std::string(p, static_cast<size_t>(sqlite3_column_bytes(s_, col)));
  }
  int64_t Int(int col) const { return sqlite3_column_int64(s_, col); }
  double Real(int col) const { return sqlite3_column_double(s_, col); }

 private:
  Status Failed() const { return absl::InternalError(absl::StrCat("job database: ", sqlite3_errmsg(db_))); }

  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
  int rc_ = SQLITE_OK;
  int n_ = 0;
};

JobRecord ReadJob(const Stmt& q) {
  JobRecord j;
  j.id = absl::StrCat("job-", q.Int(0));
  j.name = q.Text(1);
  j.submitter = q.Text(2);
  j.digest = q.Text(3);
  j.config = q.Text(4);
  j.state = StateNamed(q.Text(5));
  j.submitted_ms = q.Int(6);
  j.started_ms = q.Int(7);
  j.ended_ms = q.Int(8);
  j.reason = q.Text(9);
  j.cancel_requested = q.Int(10) != 0;
  j.committed_round = q.Int(11);
  j.total_rounds = q.Int(12);
  j.evaluated = q.Int(13) != 0;
  j.accuracy = q.Real(14);
  j.loss = q.Real(15);
  j.priority = static_cast<int>(q.Int(16));
  return j;
}

}  // namespace

int64_t JobNumber(const std::string& id) {
  if (id.rfind("job-", 0) != 0 || id.size() > 4 + 18) return 0;
  int64_t n = 0;
  for (size_t i = 4; i < id.size(); ++i) {
    if (id[i] < '0' || id[i] > '9') return 0;
    n = n * 10 + (id[i] - '0');
  }
  return n;
}

const char* JobStateName(JobState s) {
  switch (s) {
    case JobState::kQueued: return "queued";
    case JobState::kRunning: return "running";
    case JobState::kSucceeded: return "succeeded";
    case JobState::kFailed: return "failed";
    case JobState::kCancelled: return "cancelled";
  }
  return "failed";
}

bool JobEnded(JobState s) { return s != JobState::kQueued && s != JobState::kRunning; }

StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path, int max_queued,
                                                    std::function<int64_t()> now_ms) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    const std::string why = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::FailedPreconditionError(absl::StrCat("cannot open the job database ", path, ": ", why));
  }
  if (!now_ms) {
    now_ms = UnixNowMs;
  }
  std::unique_ptr<JobStore> store(new JobStore(db, max_queued, std::move(now_ms)));
  MutexLock l(&store->mu_);
  sqlite3_busy_timeout(db, 5000);
  RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"));
  RETURN_IF_ERROR(store->Exec(kSchema));
  RETURN_IF_ERROR(store->Migrate());
  // Jobs that were running when the daemon stopped: cancelled if that was asked, else
  // queued again, to resume from their checkpoints.
  RETURN_IF_ERROR(Stmt(db, "UPDATE jobs SET state = 'cancelled', ended_ms = ?, cancel_requested = 0 "
                           "WHERE state = 'running' AND cancel_requested = 1")
                      .Bind(store->now_ms_())
                      .Run());
  RETURN_IF_ERROR(store->Exec("UPDATE jobs SET state = 'queued' WHERE state = 'running'"));
  return store;
}

JobStore::JobStore(sqlite3* db, int max_queued, std::function<int64_t()> now_ms)
    : db_(db), max_queued_(max_queued), now_ms_(std::move(now_ms)) {}

JobStore::~JobStore() { sqlite3_close(db_); }

Status JobStore::Migrate() {
  // Columns added since the first schema, with their definitions.
  constexpr std::pair<const char*, const char*> kAdded[] = {{"priority", "INTEGER NOT NULL DEFAULT 0"}};
  std::set<std::string> have;
  Stmt info(db_, "PRAGMA table_info(jobs)");
  for (StatusOr<bool> row = info.Next(); row.ok() && *row; row = info.Next()) have.insert(info.Text(1));
  for (const auto& [column, definition] : kAdded) {
    if (have.count(column) == 0) RETURN_IF_ERROR(Exec(absl::StrCat("ALTER TABLE jobs ADD COLUMN ", column, " ", definition)));
  }
  return absl::OkStatus();
}

Status JobStore::Exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string why = err ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("job database: ", why));
  }
  return absl::OkStatus();
}

StatusOr<JobRecord> JobStore::Submit(const std::string& submitter, const std::string& name,
                                     const std::string& config, int64_t total_rounds, int priority) {
  MutexLock l(&mu_);
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  auto insert = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> StatusOr<JobRecord> {
    Stmt queued(db_, "SELECT COUNT(*) FROM jobs WHERE state = 'queued'");
    ASSIGN_OR_RETURN(bool row, queued.Next());
    if (row && queued.Int(0) >= max_queued_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          queued.Int(0), " jobs are queued, the daemon's limit (--max-queued); submit once some have started"));
    }
    Stmt same(db_, "SELECT seq FROM jobs WHERE name = ? AND state IN ('queued', 'running')");
    ASSIGN_OR_RETURN(row, same.Bind(name).Next());
    if (row) {
      return absl::AlreadyExistsError(
          absl::StrCat("job-", same.Int(0), " of the same name (run.name: ", Printable(name), ") is queued or running"));
    }
    const std::string digest = Sha256Hex(config);
    RETURN_IF_ERROR(
        Stmt(db_, "INSERT INTO jobs(name, submitter, digest, config, state, submitted_ms, total_rounds, priority) "
                  "VALUES(?, ?, ?, ?, 'queued', ?, ?, ?)")
            .Bind(name).Bind(submitter).Bind(digest).Bind(config).Bind(now_ms_()).Bind(total_rounds)
            .Bind(int64_t{priority}).Run());
    const std::string id = absl::StrCat("job-", sqlite3_last_insert_rowid(db_));
    RETURN_IF_ERROR(AuditLocked({now_ms_(), submitter, "submit", id, digest, "accepted"}));
    std::vector<JobRecord> jobs = Select("seq = ?", std::to_string(JobNumber(id)));
    if (jobs.empty()) return absl::InternalError("job database: a job just written is missing");
    return jobs[0];
  };
  StatusOr<JobRecord> job = insert();
  RETURN_IF_ERROR(Exec(job.ok() ? "COMMIT" : "ROLLBACK"));
  return job;
}

std::vector<JobRecord> JobStore::Select(const std::string& where, const std::string& arg,
                                        const std::string& order) const {
  Stmt q(db_, absl::StrCat("SELECT ", kColumns, " FROM jobs", where.empty() ? "" : " WHERE " + where, " ORDER BY ", order));
  if (!where.empty()) q.Bind(arg);
  std::vector<JobRecord> out;
  StatusOr<bool> row = q.Next();
  for (; row.ok() && *row; row = q.Next()) out.push_back(ReadJob(q));
  if (!row.ok()) spdlog::error("{}", row.status().ToString());  // what was read so far is returned
  return out;
}

StatusOr<JobRecord> JobStore::Get(const std::string& id) const {
  MutexLock l(&mu_);
  const int64_t seq = JobNumber(id);
  std::vector<JobRecord> jobs = seq > 0 ? Select("seq = ?", std::to_string(seq)) : std::vector<JobRecord>{};
  if (jobs.empty()) return absl::NotFoundError(absl::StrCat("no job ", Printable(id)));
  Stmt q(db_, "SELECT client, reason FROM declines WHERE seq = ? ORDER BY at_ms, client");
  q.Bind(seq);
  for (StatusOr<bool> row = q.Next(); row.ok() && *row; row = q.Next()) jobs[0].declines.emplace_back(q.Text(0), q.Text(1));
  return jobs[0];
}

Status JobStore::Decline(const std::string& id, const std::string& client, const std::string& reason) {
  MutexLock l(&mu_);
  return Stmt(db_, "INSERT OR REPLACE INTO declines(seq, client, reason, at_ms) VALUES(?, ?, ?, ?)")
      .Bind(JobNumber(id)).Bind(client).Bind(reason).Bind(now_ms_()).Run();
}

std::vector<JobRecord> JobStore::List() const {
  MutexLock l(&mu_);
  return Select("", "");
}

StatusOr<JobRecord> JobStore::StartNext() {
  MutexLock l(&mu_);
  std::vector<JobRecord> queued = Select("state = ?", "queued", "priority DESC, seq");
  if (queued.empty()) return absl::NotFoundError("no job is queued");
  JobRecord& j = queued[0];
  const int64_t now = now_ms_();
  RETURN_IF_ERROR(Stmt(db_, "UPDATE jobs SET state = 'running', started_ms = ? WHERE seq = ?")
                      .Bind(j.started_ms ? j.started_ms : now).Bind(JobNumber(j.id)).Run());
  if (j.started_ms == 0) j.started_ms = now;
  j.state = JobState::kRunning;
  return j;
}

Status JobStore::Finish(const std::string& id, JobState state, const std::string& reason) {
  MutexLock l(&mu_);
  return Stmt(db_, "UPDATE jobs SET state = ?, reason = ?, ended_ms = ?, cancel_requested = 0 WHERE seq = ?")
      .Bind(std::string(JobStateName(state))).Bind(reason).Bind(now_ms_()).Bind(JobNumber(id)).Run();
}

StatusOr<JobRecord> JobStore::Cancel(const std::string& id, const std::string& who) {
  MutexLock l(&mu_);
  const int64_t seq = JobNumber(id);
  std::vector<JobRecord> jobs = seq > 0 ? Select("seq = ?", std::to_string(seq)) : std::vector<JobRecord>{};
  if (jobs.empty()) return absl::NotFoundError(absl::StrCat("no job ", Printable(id)));
  JobRecord& j = jobs[0];
  if (JobEnded(j.state)) {
    return absl::FailedPreconditionError(absl::StrCat(j.id, " already ended (", JobStateName(j.state), ")"));
  }
  RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  Status s;
  if (j.state == JobState::kQueued) {
    j.state = JobState::kCancelled;
    j.ended_ms = now_ms_();
    j.reason = "cancelled by " + who + " before it started";
    s = Stmt(db_, "UPDATE jobs SET state = 'cancelled', ended_ms = ?, reason = ? WHERE seq = ?")
            .Bind(j.ended_ms).Bind(j.reason).Bind(seq).Run();
  } else {
    j.cancel_requested = true;
    j.reason = "cancelled by " + who;
    s = Stmt(db_, "UPDATE jobs SET cancel_requested = 1, reason = ? WHERE seq = ?").Bind(j.reason).Bind(seq).Run();
  }
  if (s.ok()) s = AuditLocked({now_ms_(), who, "cancel", j.id, j.digest, "accepted"});
  RETURN_IF_ERROR(Exec(s.ok() ? "COMMIT" : "ROLLBACK"));
  RETURN_IF_ERROR(s);
  return j;
}

Status JobStore::Progress(const std::string& id, int64_t committed_round, bool evaluated, double accuracy,
                          double loss) {
  MutexLock l(&mu_);
  return Stmt(db_, "UPDATE jobs SET committed_round = ?, evaluated = ?, accuracy = ?, loss = ? WHERE seq = ?")
      .Bind(committed_round).Bind(int64_t{evaluated}).Bind(accuracy).Bind(loss).Bind(JobNumber(id)).Run();
}

Status JobStore::Audit(const AuditEntry& e) {
  MutexLock l(&mu_);
  return AuditLocked(e);
}

Status JobStore::AuditLocked(const AuditEntry& e) {
  return Stmt(db_, "INSERT INTO audit(at_ms, who, action, job, digest, outcome) VALUES(?, ?, ?, ?, ?, ?)")
      .Bind(e.at_ms ? e.at_ms : now_ms_()).Bind(e.who).Bind(e.action).Bind(e.job).Bind(e.digest).Bind(e.outcome)
      .Run();
}

std::vector<AuditEntry> JobStore::AuditLog() const {
  MutexLock l(&mu_);
  Stmt q(db_, "SELECT at_ms, who, action, job, digest, outcome FROM audit ORDER BY seq");
  std::vector<AuditEntry> out;
  for (StatusOr<bool> row = q.Next(); row.ok() && *row; row = q.Next()) {
    out.push_back({q.Int(0), q.Text(1), q.Text(2), q.Text(3), q.Text(4), q.Text(5)});
  }
  return out;
}

}  // namespace cleave
