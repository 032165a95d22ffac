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
// Both keep a client in the job it has where the rule allows, so that a reallocation
// moves as few clients as it must.
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
};

// An attached client: its name and how many jobs it may train at once.
struct PoolSeat {
  std::string name;
  int capacity = 1;
};

using PoolAllocation = std::map<std::string, std::set<std::string>>;  // job id -> clients

class PoolScheduler {
 public:
  virtual ~PoolScheduler() = default;
  // The clients of each job in `jobs` (every job has an entry, maybe empty), given the
  // allocation in force (`current`; entries of other jobs or clients are ignored).
  virtual PoolAllocation Allocate(const std::vector<PoolJob>& jobs, const std::vector<PoolSeat>& seats,
                                  const PoolAllocation& current) const = 0;
};

const NameTable& PoolSchedulerNames();  // fifo, fair
std::unique_ptr<PoolScheduler> MakePoolScheduler(const std::string& name);

}  // namespace cleave
