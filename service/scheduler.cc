#include "service/scheduler.h"

#include <algorithm>
#include <cmath>
#include <functional>

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

// A candidate allocation of the goodput scheduler.
class GoodputPlan {
 public:
  GoodputPlan(const std::vector<PoolJob>& jobs, const std::vector<PoolSeat>& seats) {
    for (const PoolSeat& s : seats) {
      left_[s.name] = std::max(0, s.capacity);
      slowness_[s.name] = std::isfinite(s.slowness) ? std::max(1.0, s.slowness) : 1.0;
      fastest_.push_back(s.name);
    }
    std::stable_sort(fastest_.begin(), fastest_.end(), [this](const std::string& a, const std::string& b) {
      return slowness_.at(a) < slowness_.at(b);
    });
    for (const PoolJob& j : jobs) out_[j.id];
  }

  // Gives `job` the clients of `held` it may still have, then the fastest free ones up to
  // clients.min; a job that cannot reach clients.min cannot run a round and gets none.
  void Admit(const PoolJob& job, const std::set<std::string>& held) {
    std::set<std::string>& mine = out_.at(job.id);
    for (const std::string& c : held) {
      if (Room(job) && Free(job, c)) Take(job, c);
    }
    while (static_cast<int>(mine.size()) < MinOf(job) && Room(job)) {
      const std::string* c = FastestFree(job);
      if (c == nullptr) break;
      Take(job, *c);
    }
    if (static_cast<int>(mine.size()) < MinOf(job)) {
      for (const std::string& c : mine) ++left_[c];
      mine.clear();
    }
  }

  // Adds clients while some raise the sum of the speedups: each step gives one job the
  // k fastest clients it may still take, the job and k whose gain per client is the
  // largest (a slower client may be worth adding only with others of its speed).
  void Grow(const std::vector<const PoolJob*>& order) {
    for (;;) {
      const PoolJob* best = nullptr;
      std::vector<std::string> add;
      double gain = 1e-9;
      for (const PoolJob* j : order) {
        const std::set<std::string>& mine = out_.at(j->id);
        if (static_cast<int>(mine.size()) < MinOf(*j)) continue;
        double slowest = Slowest(mine);
        const double now = SpeedupOf(*j, static_cast<double>(mine.size()), slowest);
        std::vector<std::string> taken;
        for (const std::string& c : fastest_) {
          const size_t k = mine.size() + taken.size();
          if (j->max_clients > 0 && k >= static_cast<size_t>(j->max_clients)) break;
          if (!Free(*j, c)) continue;
          taken.push_back(c);
          slowest = std::max(slowest, slowness_.at(c));
          const double g = (SpeedupOf(*j, static_cast<double>(k + 1), slowest) - now) / static_cast<double>(taken.size());
          if (g > gain) best = j, add = taken, gain = g;
        }
      }
      if (best == nullptr) return;
      for (const std::string& c : add) Take(*best, c);
    }
  }

  double Value(const std::vector<PoolJob>& jobs) const {
    double v = 0;
    for (const PoolJob& j : jobs) v += Speedup(j, out_.at(j.id));
    return v;
  }
  PoolAllocation Take() { return std::move(out_); }

 private:
  static int MinOf(const PoolJob& j) { return std::max(1, j.min_clients); }
  static double Phi(const PoolJob& j) { return j.noise_scale >= 0 ? j.noise_scale : kDefaultNoiseScale; }
  // Its goodput with k clients, the slowest of them `slowest`, over its goodput with
  // clients.min of the fastest: the statistical efficiency k / (k + phi) over the round
  // time.
  static double SpeedupOf(const PoolJob& j, double k, double slowest) {
    const double min = MinOf(j), phi = Phi(j);
    if (k < min) return 0;
    return (k / (k + phi)) / RoundTime(j, slowest) * RoundTime(j, 1) / (min / (min + phi));
  }
  static double RoundTime(const PoolJob& j, double slowest) {
    if (!(j.unit_s > 0)) return slowest;
    return std::max(0.0, j.overhead_s) + j.unit_s * slowest;
  }
  double Slowest(const std::set<std::string>& clients) const {
    double slowest = 1;
    for (const std::string& c : clients) slowest = std::max(slowest, slowness_.at(c));
    return slowest;
  }
  double Speedup(const PoolJob& j, const std::set<std::string>& clients) const {
    return SpeedupOf(j, static_cast<double>(clients.size()), Slowest(clients));
  }
  bool Room(const PoolJob& j) const {
    return j.max_clients <= 0 || static_cast<int>(out_.at(j.id).size()) < j.max_clients;
  }
  bool Free(const PoolJob& j, const std::string& c) const {
    auto it = left_.find(c);
    return it != left_.end() && it->second > 0 && j.eligible.count(c) > 0 && out_.at(j.id).count(c) == 0;
  }
  const std::string* FastestFree(const PoolJob& j) const {
    for (const std::string& c : fastest_) {
      if (Free(j, c)) return &c;
    }
    return nullptr;
  }
  void Take(const PoolJob& j, const std::string& c) {
    --left_[c];
    out_.at(j.id).insert(c);
  }

  std::map<std::string, int> left_;
  std::map<std::string, double> slowness_;
  std::vector<std::string> fastest_;  // by slowness
  PoolAllocation out_;
};

class Goodput : public PoolScheduler {
 public:
  PoolAllocation Allocate(const std::vector<PoolJob>& jobs, const std::vector<PoolSeat>& seats,
                          const PoolAllocation& current) const override {
    const std::vector<const PoolJob*> order = InOrder(jobs);
    GoodputPlan fresh(jobs, seats), kept(jobs, seats);
    for (const PoolJob* j : order) {
      fresh.Admit(*j, {});
      auto held = current.find(j->id);
      kept.Admit(*j, held == current.end() ? std::set<std::string>{} : held->second);
    }
    fresh.Grow(order);
    kept.Grow(order);
    return fresh.Value(jobs) > kept.Value(jobs) * kKeepUnlessBetterBy ? fresh.Take() : kept.Take();
  }

 private:
  static constexpr double kKeepUnlessBetterBy = 1.1;
};

}  // namespace

void NoiseScaleAverage::Add(double noise, double signal) {
  if (!std::isfinite(noise) || !std::isfinite(signal)) return;
  noise_ = seen_ ? noise_ + kWeight * (noise - noise_) : noise;
  signal_ = seen_ ? signal_ + kWeight * (signal - signal_) : signal;
  seen_ = true;
}

double NoiseScaleAverage::value() const {
  constexpr double kMost = 1000;
  if (!seen_) return -1;
  if (!(signal_ > 0)) return noise_ > 0 ? kMost : 0;
  return std::clamp(noise_ / signal_, 0.0, kMost);
}

Slowness RelativeSlowness(const std::map<std::pair<std::string, std::string>, double>& seconds) {
  struct Seen {
    std::string job, client;
    double log_s;
  };
  std::vector<Seen> seen;
  std::map<std::string, double> job, client;  // the fit's log a_job and log s_client
  std::map<std::string, std::string> parent;  // union-find over "j:" jobs and "c:" clients
  std::function<std::string(const std::string&)> root = [&](const std::string& x) -> std::string {
    const std::string p = parent.at(x);
    return p == x ? x : parent[x] = root(p);
  };
  for (const auto& [key, s] : seconds) {
    if (!(s > 0) || !std::isfinite(s)) continue;
    seen.push_back({key.first, key.second, std::log(s)});
    job[key.first] = 0;
    client[key.second] = 0;
    parent.emplace("j:" + key.first, "j:" + key.first);
    parent.emplace("c:" + key.second, "c:" + key.second);
    parent[root("j:" + key.first)] = root("c:" + key.second);
  }
  // Alternating least squares: each side the mean residual of the other's fit, until
  // the client side moves by less than 1e-9 (in log units).
  double moved = 1;
  for (int it = 0; it < 200 && moved > 1e-9; ++it) {
    moved = 0;
    for (auto* side : {&job, &client}) {
      std::map<std::string, std::pair<double, int>> sum;
      for (const Seen& s : seen) {
        const bool j = side == &job;
        auto& [total, n] = sum[j ? s.job : s.client];
        total += s.log_s - (j ? client.at(s.client) : job.at(s.job));
        ++n;
      }
      for (auto& [k, v] : *side) {
        const double next = sum.at(k).first / sum.at(k).second;
        if (side == &client) moved = std::max(moved, std::abs(next - v));
        v = next;
      }
    }
  }
  std::map<std::string, double> fastest;  // per group (root), the least log s
  for (const auto& [c, v] : client) {
    auto [it, fresh] = fastest.emplace(root("c:" + c), v);
    if (!fresh) it->second = std::min(it->second, v);
  }
  Slowness out;
  for (const auto& [c, v] : client) out.clients[c] = std::exp(v - fastest.at(root("c:" + c)));
  for (const auto& [j, v] : job) out.unit_s[j] = std::exp(v + fastest.at(root("j:" + j)));
  return out;
}

const NameTable& PoolSchedulerNames() {
  static const NameTable* t = new NameTable{"--scheduler", {"fifo", "fair", "goodput"}};
  return *t;
}

std::unique_ptr<PoolScheduler> MakePoolScheduler(const std::string& name) {
  if (name == "goodput") return std::make_unique<Goodput>();
  if (name == "fair") return std::make_unique<Fair>();
  if (name == "fifo") return std::make_unique<Fifo>();
  return nullptr;
}

}  // namespace cleave
