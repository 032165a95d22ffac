// The FedAvg family. All members average client deltas weighted by example count into a
// pseudo-gradient D, then apply a server update rule (Reddi et al., "Adaptive Federated
// Optimization", 2021; Hsu et al. 2019 for server momentum):
//   fedavg, fedprox  x += eta * D
//   fedavgm          v = beta * v + D;                     x += eta * v
//   diloco           v = beta * v + D;                     x += eta * (D + beta * v)
//                    (Nesterov momentum: torch.optim.SGD(nesterov=True) on the
//                    pseudo-gradient -D, the outer step of Douillard et al. 2023)
//   fedadagrad       m = b1 m + (1-b1) D; v = v + D^2;       x += eta * m / (sqrt(v) + tau)
//   fedadam          m = b1 m + (1-b1) D; v = b2 v + (1-b2) D^2; (same step)
//   fedyogi          m = b1 m + (1-b1) D; v = v - (1-b2) D^2 sign(v - D^2); (same step)
// m starts at 0 and v at tau^2 (the paper's v_{-1} >= tau^2). FedProx differs only on
// the client: the proximal term mu travels with the task.
#include <algorithm>
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "aggregation/accumulate.h"
#include "aggregation/dp.h"
#include "aggregation/fedavg.h"
#include "aggregation/registry.h"

namespace cleave {

ClientSampler UniformSampler(const std::vector<std::string>& available, std::mt19937_64& rng) {
  return [&available, &rng](int k) {
    const int n = static_cast<int>(available.size());
    k = std::max(0, std::min(k, n));
    std::vector<std::string> pool = available;
    // Partial Fisher-Yates: the first k of a seeded shuffle.
    for (int i = 0; i < k; ++i) {
      std::uniform_int_distribution<int> pick(i, n - 1);
      std::swap(pool[i], pool[pick(rng)]);
    }
    pool.resize(k);
    std::sort(pool.begin(), pool.end());
    return pool;
  };
}

void AddScaled(const std::vector<TensorView>& delta, float scale, ParameterSet* out) {
  alignas(64) float buf[kViewBlock];
  auto& ts = out->mutable_tensors();
  for (size_t i = 0; i < ts.size(); ++i) {
    const TensorView& v = delta[i];
    for (int64_t b = 0; b < v.numel; b += kViewBlock) {
      const int64_t n = std::min(kViewBlock, v.numel - b);
      v.Read(b, n, buf);
      float* acc = ts[i].values.data() + b;
      for (int64_t j = 0; j < n; ++j) acc[j] += scale * buf[j];
    }
  }
}
namespace {

// Whether `sum` has the views' names and sizes (so a kept allocation can be reused).
bool SameLayoutAs(const ParameterSet& sum, const std::vector<TensorView>& views) {
  if (sum.size() != views.size()) return false;
  for (size_t i = 0; i < views.size(); ++i) {
    const Tensor& t = sum.tensors()[i];
    if (t.name != views[i].name || static_cast<int64_t>(t.values.size()) != views[i].numel) {
      return false;
    }
  }
  return true;
}

}  // namespace

void PartialSums::Reset(int shards) {
  if (static_cast<int>(shards_.size()) < shards) shards_.resize(shards);
  for (Shard& s : shards_) {
    s.used = false;
    s.weight = 0;
    s.count = 0;
  }
}

void PartialSums::Add(int shard, const std::vector<TensorView>& delta, float scale,
                      double weight) {
  Shard& s = shards_.at(shard);
  if (!s.used) {
    if (SameLayoutAs(s.sum, delta)) {
      for (auto& t : s.sum.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), 0.0f);
    } else {
      s.sum = ParameterSet();
      for (const TensorView& v : delta) {
        s.sum.Add(Tensor{std::string(v.name), v.shape, std::vector<float>(v.numel)}).IgnoreError();
      }
    }
    s.used = true;
  }
  AddScaled(delta, scale, &s.sum);
  s.weight += weight;
  ++s.count;
}

ParameterSet* PartialSums::Merge() {
  Shard* into = nullptr;
  for (Shard& s : shards_) {
    if (!s.used) continue;
    if (into == nullptr) {
      into = &s;
      continue;
    }
    auto& out = into->sum.mutable_tensors();
    for (size_t i = 0; i < out.size(); ++i) {
      const auto& add = s.sum.tensors()[i].values;
      float* o = out[i].values.data();
      for (size_t j = 0; j < add.size(); ++j) o[j] += add[j];
    }
  }
  return into ? &into->sum : nullptr;
}

double PartialSums::weight() const {
  double w = 0;
  for (const Shard& s : shards_) w += s.weight;
  return w;
}

int PartialSums::count() const {
  int n = 0;
  for (const Shard& s : shards_) n += s.count;
  return n;
}

namespace {

class FedAvgFamily : public Strategy {
 public:
  FedAvgFamily(std::string name, ServerRule rule, const StrategyJob& c)
      : name_(std::move(name)), rule_(rule), per_round_(c.per_round), fraction_(c.fraction),
        s_(c.strategy), train_(c.train), rounds_(c.rounds), fit_(FitOf(c.train)) {
    fit_.proximal_mu = name_ == "fedprox" ? c.strategy.proximal_mu : 0.0;
  }

  std::string name() const override { return name_; }

  using Strategy::ConfigureRound;
  RoundPlan ConfigureRound(int64_t round, const std::vector<std::string>& available,
                           const ClientSampler& sample) override {
    RoundPlan plan;
    plan.fit = fit_;
    plan.fit.lr = ScheduledLr(train_, round, rounds_);
    const int n = static_cast<int>(available.size());
    int k = per_round_ > 0 ? per_round_ : static_cast<int>(std::ceil(fraction_ * n));
    plan.clients = sample(std::max(1, std::min(k, n)));
    return plan;
  }

  RoundPlan ConfigureBuffer(int64_t version) override {
    RoundPlan plan;
    plan.fit = fit_;
    plan.fit.lr = ScheduledLr(train_, version, rounds_);
    return plan;
  }

  void BeginRound(const ParameterSet& global, int shards) override {
    (void)global;
    sums_.Reset(shards);
  }

  void Accumulate(const ClientUpdate& u, int shard) override {
    sums_.Add(shard, u.delta, static_cast<float>(u.weight), static_cast<double>(u.weight));
  }

  int accumulated() const override { return sums_.count(); }

  Status FinishRound(int num_failures, ParameterSet* global) override {
    const double total_weight = sums_.weight();
    const ParameterSet* sum_set = sums_.Merge();
    if (sum_set == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("no results to aggregate (", num_failures, " failures)"));
    }
    if (!sum_set->SameLayout(*global)) {
      return absl::InternalError("global model changed layout during the round");
    }
    EnsureState(*global);
    const float inv = static_cast<float>(1.0 / total_weight);
    const float eta = static_cast<float>(s_.server_lr);
    const float b1 = static_cast<float>(s_.beta1), b2 = static_cast<float>(s_.beta2);
    const float tau = static_cast<float>(s_.tau), beta = static_cast<float>(s_.server_momentum);
    auto& xs = global->mutable_tensors();
    for (size_t i = 0; i < xs.size(); ++i) {
      float* x = xs[i].values.data();
      const float* sum = sum_set->tensors()[i].values.data();
      float* m = rule_ == ServerRule::kSgd ? nullptr : m_.mutable_tensors()[i].values.data();
      float* v = HasV() ? v_.mutable_tensors()[i].values.data() : nullptr;
      const size_t n = xs[i].values.size();
      for (size_t j = 0; j < n; ++j) {
        const float d = sum[j] * inv;
        switch (rule_) {
          case ServerRule::kSgd:
            x[j] += eta * d;
            break;
          case ServerRule::kMomentum:
            m[j] = beta * m[j] + d;
            x[j] += eta * m[j];
            break;
          case ServerRule::kNesterov:
            m[j] = beta * m[j] + d;
            x[j] += eta * (d + beta * m[j]);
            break;
          case ServerRule::kAdagrad:
          case ServerRule::kAdam:
          case ServerRule::kYogi: {
            m[j] = b1 * m[j] + (1 - b1) * d;
            const float d2 = d * d;
            if (rule_ == ServerRule::kAdagrad) {
              v[j] = v[j] + d2;
            } else if (rule_ == ServerRule::kAdam) {
              v[j] = b2 * v[j] + (1 - b2) * d2;
            } else {
              const float diff = v[j] - d2;
              const float sign = diff > 0 ? 1.0f : (diff < 0 ? -1.0f : 0.0f);
              v[j] = v[j] - (1 - b2) * d2 * sign;
            }
            x[j] += eta * m[j] / (std::sqrt(v[j]) + tau);
            break;
          }
        }
      }
    }
    sums_.Reset(1);
    return absl::OkStatus();
  }

  ParameterSet State() const override {
    ParameterSet state;
    auto add = [&state](const ParameterSet& ps, const std::string& prefix) {
      for (const auto& t : ps.tensors()) {
        state.Add(Tensor{prefix + t.name, t.shape, t.values}).IgnoreError();
      }
    };
    add(m_, "m/");
    add(v_, "v/");
    return state;
  }

  Status Restore(const ParameterSet& state) override {
    ParameterSet m, v;
    for (const auto& t : state.tensors()) {
      const std::string prefix = t.name.substr(0, 2);
      Tensor copy{t.name.substr(2), t.shape, t.values};
      if (prefix == "m/") {
        RETURN_IF_ERROR(m.Add(std::move(copy)));
      } else if (prefix == "v/") {
        RETURN_IF_ERROR(v.Add(std::move(copy)));
      } else {
        return absl::InvalidArgumentError(absl::StrCat("unexpected strategy state ", t.name));
      }
    }
    m_ = std::move(m);
    v_ = std::move(v);
    return absl::OkStatus();
  }

 private:
  bool HasV() const {
    return rule_ == ServerRule::kAdagrad || rule_ == ServerRule::kAdam ||
           rule_ == ServerRule::kYogi;
  }

  // Creates the optimizer state on first use (or after a layout change).
  void EnsureState(const ParameterSet& global) {
    if (rule_ == ServerRule::kSgd) return;
    if (!m_.SameLayout(global)) m_ = global.ZerosLike();
    if (HasV() && !v_.SameLayout(global)) {
      v_ = global.ZerosLike();
      const float tau2 = static_cast<float>(s_.tau * s_.tau);
      for (auto& t : v_.mutable_tensors()) std::fill(t.values.begin(), t.values.end(), tau2);
    }
  }

  const std::string name_;
  const ServerRule rule_;
  const int per_round_;
  const double fraction_;
  const StrategyConfig s_;
  const TrainConfig train_;
  const int64_t rounds_;
  FitSettings fit_;

  PartialSums sums_;  // weight * delta of the current round's results
  ParameterSet m_;  // momentum / first moment
  ParameterSet v_;  // second moment
};

}  // namespace

std::unique_ptr<Strategy> MakeFedAvgFamily(const std::string& name, ServerRule rule,
                                           const StrategyJob& job) {
  return std::make_unique<FedAvgFamily>(name, rule, job);
}

StatusOr<std::unique_ptr<Strategy>> CreateStrategy(const StrategyJob& config) {
  ASSIGN_OR_RETURN(const StrategyKind* kind, Strategies().Get(config.strategy.name));
  ASSIGN_OR_RETURN(std::unique_ptr<Strategy> s, kind->make(config));
  if (absl::EndsWith(config.update_codec, ":ef21")) s = MakeEstimateStrategy(std::move(s));
  if (config.aggregation.rule != "mean") s = MakeRobustStrategy(std::move(s), config.aggregation);
  // DP noise must not be predictable from the job's seed: it comes from the OS.
  if (config.dp.enabled) s = MakeDpStrategy(std::move(s), config.dp, std::random_device{}());
  return s;
}

}  // namespace cleave
