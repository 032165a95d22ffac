// The daemon's side of the pool (proto/cleave/v1/pool.proto): the long-lived clients
// attached to it, what each exposes and accepts, the jobs each was offered or runs, and
// who declined what. The daemon's scheduling pass (service/daemon.cc) reads it with
// Members() and acts through Offer and Release; every change it sees calls `changed`.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cleave/v1/pool.grpc.pb.h"
#include "core/mutex.h"
#include "core/status.h"

namespace cleave {

// An attached client, as a scheduling pass sees it.
struct PoolMemberView {
  std::string name;
  v1::PoolHello hello;  // its datasets and site policy
  struct Held {
    bool accepted = false;  // false: offered, not answered yet
    int port = 0;           // the job's port it was offered (or runs it at, after a reconnect)
  };
  std::map<std::string, Held> jobs;
  // Its last PoolPause: no job before this Unix time (ms; 0 or past: none), and why.
  int64_t paused_until_ms = 0;
  std::string pause_reason;
  bool PausedAt(int64_t now_ms) const { return paused_until_ms > now_ms; }
};

class PoolService final : public v1::Pool::Service {
 public:
  // `changed` is called, without the pool's lock, after each attach, answer, departure
  // and detach.
  explicit PoolService(std::function<void()> changed) : changed_(std::move(changed)) {}

  grpc::Status Attach(grpc::ServerContext* ctx, grpc::ServerReaderWriter<v1::PoolDown, v1::PoolUp>* stream) override;

  std::vector<PoolMemberView> Members() ABSL_LOCKS_EXCLUDED(mu_);
  // Who declined or left job `id`, and why ("" for a client that left it after its end).
  std::map<std::string, std::string> Declines(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Offers `offer` to client `name`, which holds it as offered until it answers.
  void Offer(const std::string& name, v1::JobOffer offer) ABSL_LOCKS_EXCLUDED(mu_);
  // Tells client `name` to leave job `id`.
  void Release(const std::string& name, const std::string& id, const std::string& reason) ABSL_LOCKS_EXCLUDED(mu_);
  // Job `id` ended: its declines are dropped (its clients are released by the caller).
  void Forget(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every attachment (the daemon stops).
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Member;
  // Writes `msg` to `m` unless its stream has ended.
  static void Write(Member* m, const v1::PoolDown& msg);
  // Handles one message of an attached client; an error ends its attachment.
  Status Handle(const std::shared_ptr<Member>& m, const v1::PoolUp& up) ABSL_LOCKS_EXCLUDED(mu_);

  const std::function<void()> changed_;
  Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Member>> members_ ABSL_GUARDED_BY(mu_);
  // job id -> client -> why it declined or left (bounded by the running jobs' clients)
  std::map<std::string, std::map<std::string, std::string>> declines_ ABSL_GUARDED_BY(mu_);
};

// Checks a client's pause at `now_ms`: until 0 (resumed) or within the next 25 hours, a
// reason of at most 512 bytes. INVALID_ARGUMENT otherwise.
Status CheckPause(const v1::PoolPause& pause, int64_t now_ms);

// Checks a client's hello: names (of the client, its datasets) printable and at most 128
// bytes, datasets unique and at most 64, held jobs at most 64. INVALID_ARGUMENT naming
// what is wrong.
Status CheckHello(const v1::PoolHello& hello);

}  // namespace cleave
