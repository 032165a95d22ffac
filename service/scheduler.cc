#include "service/scheduler.h"

#include <algorithm>

namespace cleave {
namespace {

// An allocation under construction: what each client has left, and each job's clients.
class Dealer {
 public:
  Dealer(const std::vector<PoolJob>& jobs, const std::vector<PoolSeat>& seats, const PoolAllocation& current)
      : current_(current) {
    for (const PoolSeat& s : seats) left_[s.name] = std::max(0, s.capacity);
    for (const PoolJob& j : jobs) out_[j.id];
  }

  // Whether `job` can take one more client.
  bool Wants(const PoolJob& job, int up_to) const {
    const int has = static_cast<int>(out_.at(job.id).size());
    return has < up_to && (job.max_clients <= 0 || has < job.max_clients);
  }

  // Gives `job` one more client: one it has now if it can, else the first free one by
  // name. False when none is left to it.
  bool TakeOne(const PoolJob& job) {
    std::set<std::string>& mine = out_[job.id];
    auto held = current_.find(job.id);
    if (held != current_.end()) {
      for (const std::string& c : held->second) {
        if (Free(job, c, mine)) return Take(c, &mine);
      }
    }
    for (const std::string& c : job.eligible) {
      if (Free(job, c, mine)) return Take(c, &mine);
    }
    return false;
  }

  PoolAllocation Take() { return std::move(out_); }

 private:
  bool Free(const PoolJob& job, const std::string& c, const std::set<std::string>& mine) const {
    auto it = left_.find(c);
    return it != left_.end() && it->second > 0 && job.eligible.count(c) > 0 && mine.count(c) == 0;
  }
  bool Take(const std::string& c, std::set<std::string>* mine) {
    --left_[c];
    mine->insert(c);
    return true;
  }

  const PoolAllocation& current_;
  std::map<std::string, int> left_;
  PoolAllocation out_;
};

// Jobs by priority (higher first), then submission.
std::vector<const PoolJob*> InOrder(const std::vector<PoolJob>& jobs) {
  std::vector<const PoolJob*> order;
  for (const PoolJob& j : jobs) order.push_back(&j);
  std::stable_sort(order.begin(), order.end(), [](const PoolJob* a, const PoolJob* b) {
    return a->priority != b->priority ? a->priority > b->priority : a->order < b->order;
  });
  return order;
}

constexpr int kAll = 1 << 30;

class Fifo : public PoolScheduler {
 public:
  PoolAllocation Allocate(const std::vector<PoolJob>& jobs, const std::vector<PoolSeat>& seats,
                          const PoolAllocation& current) const override {
    Dealer d(jobs, seats, current);
    for (const PoolJob* j : InOrder(jobs)) {
      while (d.Wants(*j, kAll) && d.TakeOne(*j)) {
      }
    }
    return d.Take();
  }
};

class Fair : public PoolScheduler {
 public:
  PoolAllocation Allocate(const std::vector<PoolJob>& jobs, const std::vector<PoolSeat>& seats,
                          const PoolAllocation& current) const override {
    Dealer d(jobs, seats, current);
    const std::vector<const PoolJob*> order = InOrder(jobs);
    for (const PoolJob* j : order) {
      while (d.Wants(*j, j->min_clients) && d.TakeOne(*j)) {
      }
    }
    for (bool dealt = true; dealt;) {
      dealt = false;
      for (const PoolJob* j : order) dealt |= d.Wants(*j, kAll) && d.TakeOne(*j);
    }
    return d.Take();
  }
};

}  // namespace

const NameTable& PoolSchedulerNames() {
  static const NameTable* t = new NameTable{"--scheduler", {"fifo", "fair"}};
  return *t;
}

std::unique_ptr<PoolScheduler> MakePoolScheduler(const std::string& name) {
  if (name == "fair") return std::make_unique<Fair>();
  if (name == "fifo") return std::make_unique<Fifo>();
  return nullptr;
}

}  // namespace cleave
