// A long-lived client's membership of a daemon's pool (cleave-client --stay,
// proto/cleave/v1/pool.proto): it attaches once with the datasets it exposes and its site
// policy, and for each job the daemon offers it either declines (the policy's reason) or
// runs a Client (client/client.h) of its own for that job, on a copy of the dataset the
// job names. Everything a job leaves on the device (its client's model, personal layers
// under STATE_DIR/jobs/ID, codec residuals, SecAgg keys, split parts) lives and dies with
// that client: a job's end drops it and disconnects nothing else. A lost attachment is
// retried with backoff, the jobs running meanwhile kept; attaching again lists them.
// Under a policy's daily limits (max_rounds_per_day, max_training_hours_per_day) every
// task trained is in a UsageLedger (STATE_DIR/usage.ledger); once a limit is spent the
// member tells the daemon it pauses until the limit frees, leaves its jobs, and declines
// tasks and offers until then.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "cleave/v1/pool.pb.h"
#include "client/client.h"
#include "core/mutex.h"
#include "core/status.h"
#include "service/usage_ledger.h"

namespace grpc {
class ClientContext;
template <class W, class R>
class ClientReaderWriter;
}  // namespace grpc

namespace cleave {

struct PoolMemberOptions {
  // The pool's address (server), TLS, token, name, state directory, emulation and the
  // rest that every job's client shares; its train and holdout are unused.
  ClientOptions client;
  // The datasets exposed, by name ("default": --data): each job's client gets a copy.
  struct Data {
    Dataset train, holdout;
  };
  std::map<std::string, Data> datasets;
  v1::SitePolicy policy;  // given = false: none
};

class PoolMember {
 public:
  explicit PoolMember(PoolMemberOptions options);
  ~PoolMember();

  // Attaches and runs the jobs offered until Stop (CANCELLED), until the daemon was
  // unreachable for client.give_up_after_s (UNAVAILABLE), or until it refuses the
  // attachment in a way retrying cannot change (RetryCannotHelp: a bad hello, no or the
  // wrong certificate, a server that is no daemon), with that refusal.
  Status Run() ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // The Prometheus text of a job it runs (the oldest); empty between jobs.
  std::string MetricsText() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Job;
  using Stream = grpc::ClientReaderWriter<v1::PoolUp, v1::PoolDown>;
  // One attachment, until its stream ends: OK once it was welcomed.
  Status Attach() ABSL_LOCKS_EXCLUDED(mu_);
  v1::PoolHello Hello() ABSL_LOCKS_EXCLUDED(mu_);
  // Answers `offer`: declined by the policy or for lack of capacity, else run.
  v1::JobAnswer Take(const v1::JobOffer& offer) ABSL_LOCKS_EXCLUDED(mu_);
  // Leaves job `id`: returns once its client ended.
  void Release(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes `up` on the attachment, if there is one.
  void Send(const v1::PoolUp& up) ABSL_LOCKS_EXCLUDED(mu_);
  // Joins and drops the jobs whose client ended.
  void DropEnded() ABSL_LOCKS_EXCLUDED(mu_);
  // The daily limits: whether a task may train now (RESOURCE_EXHAUSTED naming the limit
  // and when it frees); a task trained; and the pause to tell the daemon, when one is due
  // (`always`: even if it was told already, as on a new attachment).
  Status MayTrain() ABSL_LOCKS_EXCLUDED(mu_);
  void Trained(double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<v1::PoolUp> DuePause(bool always) ABSL_LOCKS_EXCLUDED(mu_);

  const PoolMemberOptions opts_;
  Mutex mu_;
  CondVar cv_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  Status refused_ ABSL_GUARDED_BY(mu_);  // the refusal Run ended on
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;  // the attachment's call
  Stream* stream_ ABSL_GUARDED_BY(mu_) = nullptr;            // null when not attached
  std::map<std::string, std::unique_ptr<Job>> jobs_ ABSL_GUARDED_BY(mu_);
  std::optional<UsageLedger> ledger_ ABSL_GUARDED_BY(mu_);  // under daily limits
  int64_t pause_told_ ABSL_GUARDED_BY(mu_) = 0;             // the last pause sent (until, ms)
};

}  // namespace cleave
