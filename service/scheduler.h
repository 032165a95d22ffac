// How a daemon divides its pool of attached clients among the jobs it runs
// (cleave-server --daemon --scheduler NAME): each time a job starts or ends, a client
// attaches, leaves, accepts or declines, the scheduler computes which clients each job
// has. A client is in at most as many jobs as its site policy's max_concurrent_jobs.
//
// - fifo: jobs by run.priority (higher first), then by submission; each takes every
//   client it can use before the next gets any. A higher job takes clients from lower
//   ones.
// - fair: every job first gets up to clients.min (in the fifo order), then the clients
//   left are dealt one at a time to each job in turn, so that the running jobs' shares
//   differ by at most one where their eligible clients allow.
//
// - goodput (after Pollux, Qiao et al., OSDI 2021): each job's goodput with a set of
//   clients is its statistical efficiency, k / (k + phi) for k clients per round and
//   the job's measured update noise scale phi, over its round time: what a round costs
//   besides training, plus the training time of the slowest client it has (each
//   client's measured slowness). Jobs are admitted in the fifo order
//   with the fastest free clients they may use; each further client goes where it raises
//   the sum of the jobs' speedups (goodput over the goodput of clients.min of the
//   fastest clients) the most, and stays free when it would lower every job's: a slow
//   client added to fast ones costs more time than its update is worth. The allocation
//   in force is kept unless the new one is 10 % better: a moved client costs the rounds
//   it leaves.
//
// Both fifo and fair keep a client in the job it has where the rule allows, so that a
// reallocation moves as few clients as it must.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/names.h"

namespace cleave {

// A running job as the scheduler sees it.
struct PoolJob {
  std::string id;
  int priority = 0;        // run.priority
  int64_t order = 0;       // submission order
  int min_clients = 1;     // clients.min
  int max_clients = 0;     // the most it uses at once (clients.per_round); 0: any number
  std::set<std::string> eligible;  // the clients that may take it
  // goodput: the job's update noise scale phi (in clients: how many updates it takes for
  // their spread to equal their mean's norm; Pollux's gradient noise scale), < 0 when
  // not measured (kDefaultNoiseScale is assumed).
  double noise_scale = -1;
  // goodput: its round time is overhead_s + unit_s x the slowness of its slowest client:
  // unit_s the training time of a task on a client of slowness 1, overhead_s the rest of
  // a round (model transfer, aggregation, the server's evaluation). unit_s 0 (not
  // measured yet): the round time is taken as the slowest client's slowness alone.
  double unit_s = 0, overhead_s = 0;
};

// The noise scale goodput assumes for a job that has not measured its own.
constexpr double kDefaultNoiseScale = 2.0;

// A job's noise scale from its rounds' estimates (RoundMetrics::update_noise): moving
// averages of the noise and of the signal, divided (Pollux smooths both before it
// divides); -1 before the first, within [0, 1000].
class NoiseScaleAverage {
 public:
  void Add(double noise, double signal);
  double value() const;

 private:
  static constexpr double kWeight = 0.3;  // of each new estimate
  double noise_ = 0, signal_ = 0;
  bool seen_ = false;
};

// An attached client: its name and how many jobs it may train at once.
struct PoolSeat {
  std::string name;
  int capacity = 1;
  double slowness = 1;  // goodput: its round time relative to the fastest client's (>= 1)
};

// Each client's slowness (>= 1, the fastest 1) from measured task times, `seconds`
// keyed (job, client): the least-squares fit of log t = log a_job + log s_client, which
// compares clients that never ran the same job through the jobs they did. Clients not
// linked by any job to the fastest are compared within their own group. With each job's
// a_job: its task time on a client of slowness 1 (PoolJob::unit_s).
struct Slowness {
  std::map<std::string, double> clients;  // slowness by client
  std::map<std::string, double> unit_s;   // seconds by job
};
Slowness RelativeSlowness(const std::map<std::pair<std::string, std::string>, double>& seconds);

using PoolAllocation = std::map<std::string, std::set<std::string>>;  // job id -> clients

class PoolScheduler {
 public:
  virtual ~PoolScheduler() = default;
  // The clients of each job in `jobs` (every job has an entry, maybe empty), given the
  // allocation in force (`current`; entries of other jobs or clients are ignored).
  virtual PoolAllocation Allocate(const std::vector<PoolJob>& jobs, const std::vector<PoolSeat>& seats,
                                  const PoolAllocation& current) const = 0;
};

const NameTable& PoolSchedulerNames();  // fifo, fair, goodput
std::unique_ptr<PoolScheduler> MakePoolScheduler(const std::string& name);

}  // namespace cleave
