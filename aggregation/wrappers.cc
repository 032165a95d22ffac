// Strategies that reduce a round's updates to one their own way (DP-FedAvg, robust
// rules) and hand it to an inner FedAvg-family strategy, which applies its server rule.
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "aggregation/accumulate.h"
#include "aggregation/dp.h"
#include "aggregation/robust.h"
#include "privacy/accountant.h"

namespace cleave {
namespace {

double Norm(const std::vector<TensorView>& delta) {
  double s = 0;
  alignas(64) float buf[kViewBlock];
  for (const auto& v : delta) {
    for (int64_t b = 0; b < v.numel; b += kViewBlock) {
      const int64_t n = std::min(kViewBlock, v.numel - b);
      v.Read(b, n, buf);
      for (int64_t j = 0; j < n; ++j) s += static_cast<double>(buf[j]) * buf[j];
    }
  }
  return std::sqrt(s);
}

// Splits `state` into the inner strategy's tensors and those whose names start with
// `prefix` (prefix removed).
std::pair<ParameterSet, ParameterSet> SplitState(const ParameterSet& state,
                                                 const std::string& prefix) {
  ParameterSet inner, own;
  for (const auto& t : state.tensors()) {
    if (t.name.rfind(prefix, 0) == 0) {
      own.Add(Tensor{t.name.substr(prefix.size()), t.shape, t.values}).IgnoreError();
    } else {
      inner.Add(t).IgnoreError();
    }
  }
  return {std::move(inner), std::move(own)};
}

class DpStrategy : public Strategy {
 public:
  DpStrategy(std::unique_ptr<Strategy> inner, DpConfig c, uint64_t seed)
      : inner_(std::move(inner)),
        c_(std::move(c)),
        clip_(c_.clip),
        rng_(seed),
        orders_(dp::DefaultOrders()),
        rdp_(orders_.size(), 0) {}

  std::string name() const override { return inner_->name() + "+dp"; }

  using Strategy::ConfigureRound;
  RoundPlan ConfigureRound(int64_t round, const std::vector<std::string>& available,
                           const ClientSampler& sample) override {
    RoundPlan plan = inner_->ConfigureRound(round, available, sample);
    q_ = available.empty() ? 1.0 : static_cast<double>(plan.clients.size()) / available.size();
    CheckBudget(round, &plan);
    return plan;
  }

  // Async clients are not sampled, so no amplification by sampling is claimed: each
  // applied buffer is accounted as a Gaussian mechanism over all clients (q = 1). The
  // scheduler admits at most one update per client into a buffer, so one client moves
  // a buffer's clipped sum by at most the clip norm.
  RoundPlan ConfigureBuffer(int64_t version) override {
    RoundPlan plan = inner_->ConfigureBuffer(version);
    q_ = 1.0;
    CheckBudget(version, &plan);
    return plan;
  }

  // Sets plan->stop_reason when round `round` would exceed dp.target_epsilon.
  void CheckBudget(int64_t round, RoundPlan* plan) const {
    if (c_.target_epsilon > 0) {
      auto next = RdpAfter(q_);
      auto eps = next.ok() ? dp::EpsilonFromRdp(orders_, *next, c_.delta) : next.status();
      if (!eps.ok() || eps->epsilon > c_.target_epsilon) {
        plan->stop_reason = absl::StrCat(
            "privacy budget: round ", round, " would bring epsilon to ",
            eps.ok() ? eps->epsilon : INFINITY, " > dp.target_epsilon ", c_.target_epsilon);
      }
    }
  }

  void BeginRound(const ParameterSet& global, int shards) override {
    inner_->BeginRound(global, shards);
    holders_ = ParameterSet();
    sums_.Reset(shards);
    unclipped_.assign(std::max<size_t>(unclipped_.size(), shards), 0);
    distributed_count_.assign(std::max<size_t>(distributed_count_.size(), shards), 0);
  }

  void Accumulate(const ClientUpdate& u, int shard) override {
    if (c_.noise == "distributed") {
      // The unmasked mean of clipped, noised updates; its weight is how many clients it
      // sums (the server's secure aggregation says so).
      distributed_count_[shard] += static_cast<int>(u.weight);
      inner_->Accumulate(u, shard);
      return;
    }
    const double norm = Norm(u.delta);
    if (norm <= clip_) ++unclipped_[shard];
    sums_.Add(shard, u.delta, static_cast<float>(ClipFactor(norm, clip_)), 1);
  }

  void SetHolders(const ParameterSet& holders) override { holders_ = holders; }

  int accumulated() const override {
    int n = sums_.count();
    for (int c : distributed_count_) n += c;
    return n;
  }

  Status FinishRound(int num_failures, ParameterSet* global) override {
    const int count = accumulated();
    if (count == 0) return inner_->FinishRound(num_failures, global);
    int unclipped = 0;
    for (int u : unclipped_) unclipped += u;
    double z_update = c_.noise_multiplier;
    const double sigma_b =
        c_.clip_count_stddev > 0 ? c_.clip_count_stddev : std::max(count / 20.0, c_.noise_multiplier);
    if (c_.adaptive) {
      ASSIGN_OR_RETURN(z_update, UpdateNoiseMultiplier(c_.noise_multiplier, sigma_b));
    }
    if (c_.noise == "central") {
      noise_std_ = z_update * clip_ / count;
      std::normal_distribution<double> noise(0, noise_std_);
      ParameterSet& mean = *sums_.Merge();
      if (holders_.size() == 0) {
        for (auto& t : mean.mutable_tensors()) {
          for (float& v : t.values) v = static_cast<float>(v / count + noise(rng_));
        }
      } else {
        // Submodels: each element's noised sum over its holders (the same noise, z·C on
        // the sum); an element nobody held stays.
        if (!holders_.SameLayout(mean)) return absl::InternalError("dp: holders of another layout");
        std::normal_distribution<double> sum_noise(0, z_update * clip_);
        for (size_t t = 0; t < mean.size(); ++t) {
          const auto& h = holders_.tensors()[t].values;
          auto& values = mean.mutable_tensors()[t].values;
          for (size_t i = 0; i < values.size(); ++i) {
            const double noised = values[i] + sum_noise(rng_);
            values[i] = h[i] > 0 ? static_cast<float>(noised / h[i]) : 0.0f;
          }
        }
      }
      inner_->Accumulate(ClientUpdate::Unnamed(ViewsOf(mean), count), 0);
    } else {
      noise_std_ = z_update * clip_ / count;  // the sum of the clients' shares, averaged
    }
    RETURN_IF_ERROR(inner_->FinishRound(num_failures, global));
    used_clip_ = clip_;
    if (c_.adaptive) {
      std::normal_distribution<double> count_noise(0, sigma_b);
      unclipped_fraction_ = (unclipped + count_noise(rng_)) / count;
      clip_ *= std::exp(-c_.clip_lr * (unclipped_fraction_ - c_.target_quantile));
    }
    ASSIGN_OR_RETURN(rdp_, RdpAfter(q_));
    ASSIGN_OR_RETURN(epsilon_, dp::EpsilonFromRdp(orders_, rdp_, c_.delta));
    return absl::OkStatus();
  }

  ParameterSet State() const override {
    ParameterSet s = inner_->State();
    s.Add(Tensor{"dp/clip", {1}, {static_cast<float>(clip_)}}).IgnoreError();
    // RDP values are kept as float pairs (hi, lo) so the restored sum stays exact enough.
    std::vector<float> rdp;
    for (double r : rdp_) {
      const float hi = static_cast<float>(r);
      rdp.push_back(hi);
      rdp.push_back(static_cast<float>(r - hi));
    }
    s.Add(Tensor{"dp/rdp", {static_cast<int64_t>(rdp.size())}, rdp}).IgnoreError();
    return s;
  }

  Status Restore(const ParameterSet& state) override {
    auto [inner, own] = SplitState(state, "dp/");
    RETURN_IF_ERROR(inner_->Restore(inner));
    const Tensor* clip = own.Find("clip");
    const Tensor* rdp = own.Find("rdp");
    if (!clip || !rdp || clip->values.size() != 1 || rdp->values.size() != 2 * orders_.size()) {
      return absl::InvalidArgumentError("the checkpoint lacks DP state (dp/clip, dp/rdp)");
    }
    clip_ = clip->values[0];
    for (size_t i = 0; i < orders_.size(); ++i) {
      rdp_[i] = static_cast<double>(rdp->values[2 * i]) + rdp->values[2 * i + 1];
    }
    auto eps = dp::EpsilonFromRdp(orders_, rdp_, c_.delta);
    if (eps.ok()) epsilon_ = *eps;
    return absl::OkStatus();
  }

  std::map<std::string, double> RoundStats() const override {
    std::map<std::string, double> s = inner_->RoundStats();
    s["epsilon"] = epsilon_.epsilon;
    s["delta"] = c_.delta;
    s["dp_clip"] = used_clip_;
    s["dp_noise_std"] = noise_std_;
    s["dp_sampling_rate"] = q_;
    if (c_.adaptive) s["dp_unclipped_fraction"] = unclipped_fraction_;
    return s;
  }

 private:
  StatusOr<std::vector<double>> RdpAfter(double q) const {
    ASSIGN_OR_RETURN(auto step, dp::ComputeRdp(q, c_.noise_multiplier, 1, orders_));
    for (size_t i = 0; i < step.size(); ++i) step[i] += rdp_[i];
    return step;
  }

  std::unique_ptr<Strategy> inner_;
  DpConfig c_;
  double clip_;
  std::mt19937_64 rng_;
  std::vector<double> orders_, rdp_;
  double q_ = 1;
  PartialSums sums_;  // clipped updates (central noise)
  ParameterSet holders_;  // the round's, when its results are zero-padded submodels
  // Per shard: updates within the clip norm; distributed noise: clients summed.
  std::vector<int> unclipped_, distributed_count_;
  double used_clip_ = 0, noise_std_ = 0, unclipped_fraction_ = 0;
  dp::Epsilon epsilon_;
};

class RobustStrategy : public Strategy {
 public:
  RobustStrategy(std::unique_ptr<Strategy> inner, AggregationConfig c)
      : inner_(std::move(inner)), c_(std::move(c)) {}

  std::string name() const override { return inner_->name() + "+" + c_.rule; }

  using Strategy::ConfigureRound;
  RoundPlan ConfigureRound(int64_t round, const std::vector<std::string>& available,
                           const ClientSampler& sample) override {
    return inner_->ConfigureRound(round, available, sample);
  }
  RoundPlan ConfigureBuffer(int64_t version) override { return inner_->ConfigureBuffer(version); }

  void BeginRound(const ParameterSet& global, int shards) override {
    inner_->BeginRound(global, shards);
    layout_ = global.ZerosLike();
    shards_.assign(shards, Shard{});
  }

  void Accumulate(const ClientUpdate& u, int shard) override {
    std::vector<float> flat;
    for (const auto& v : u.delta) {
      const size_t at = flat.size();
      flat.resize(at + v.numel);
      v.Read(0, v.numel, flat.data() + at);
    }
    shards_[shard].updates.push_back(std::move(flat));
    shards_[shard].weights.push_back(static_cast<double>(u.weight));
  }

  int accumulated() const override {
    size_t n = 0;
    for (const Shard& s : shards_) n += s.updates.size();
    return static_cast<int>(n);
  }

  Status FinishRound(int num_failures, ParameterSet* global) override {
    if (accumulated() == 0) return inner_->FinishRound(num_failures, global);
    robust::Updates updates;
    std::vector<double> weights;
    for (Shard& s : shards_) {
      for (auto& u : s.updates) updates.push_back(std::move(u));
      weights.insert(weights.end(), s.weights.begin(), s.weights.end());
    }
    shards_.clear();
    ASSIGN_OR_RETURN(std::vector<float> agg,
                     robust::Aggregate(c_.rule, updates, weights, c_.f, c_.m, c_.max_norm,
                                       reference_));
    reference_.clear();
    size_t at = 0;
    for (auto& t : layout_.mutable_tensors()) {
      std::copy(agg.begin() + at, agg.begin() + at + t.values.size(), t.values.begin());
      at += t.values.size();
    }
    inner_->Accumulate(ClientUpdate::Unnamed(ViewsOf(layout_), 1), 0);
    return inner_->FinishRound(num_failures, global);
  }

  void SetReference(const ParameterSet& server_update) override {
    reference_.clear();
    for (const auto& t : server_update.tensors()) {
      reference_.insert(reference_.end(), t.values.begin(), t.values.end());
    }
  }

  ParameterSet State() const override { return inner_->State(); }
  Status Restore(const ParameterSet& state) override { return inner_->Restore(state); }
  std::map<std::string, double> RoundStats() const override { return inner_->RoundStats(); }

 private:
  std::unique_ptr<Strategy> inner_;
  AggregationConfig c_;
  ParameterSet layout_;
  // Each shard's updates (flattened) and weights: the rules need every update at once.
  struct Shard {
    robust::Updates updates;
    std::vector<double> weights;
  };
  std::vector<Shard> shards_;
  std::vector<float> reference_;  // fltrust: the server's update this round, flattened
};

// EF21 (Richtarik, Sokolov, Fatkhullin 2021) on the server: clients upload compressed
// increments c_i = C(delta_i - h_i) of an estimate h_i of their update that both sides
// track (h_i += c_i). The server keeps the weighted mean of the estimates, H, adds the
// round's mean increment, and hands H to the inner strategy as the round's update:
// the model moves by the full estimate every round, not only by what was just sent.
// With a client missing a round, H keeps that client's last estimate in it.
class EstimateStrategy : public Strategy {
 public:
  explicit EstimateStrategy(std::unique_ptr<Strategy> inner) : inner_(std::move(inner)) {}

  std::string name() const override { return inner_->name() + "+ef21"; }

  using Strategy::ConfigureRound;
  RoundPlan ConfigureRound(int64_t round, const std::vector<std::string>& available,
                           const ClientSampler& sample) override {
    return inner_->ConfigureRound(round, available, sample);
  }
  RoundPlan ConfigureBuffer(int64_t version) override { return inner_->ConfigureBuffer(version); }

  void BeginRound(const ParameterSet& global, int shards) override {
    inner_->BeginRound(global, shards);
    if (estimate_.size() == 0) estimate_ = global.ZerosLike();
    sums_.Reset(shards);
  }

  void Accumulate(const ClientUpdate& u, int shard) override {
    sums_.Add(shard, u.delta, static_cast<float>(u.weight), static_cast<double>(u.weight));
  }

  int accumulated() const override { return sums_.count(); }

  Status FinishRound(int num_failures, ParameterSet* global) override {
    const double weight = sums_.weight();
    const ParameterSet* sum = sums_.Merge();
    if (sum == nullptr) return inner_->FinishRound(num_failures, global);
    auto& est = estimate_.mutable_tensors();
    const auto& model = sum->tensors();
    bool same = est.size() == model.size();
    for (size_t i = 0; same && i < est.size(); ++i) {
      same = est[i].name == model[i].name && est[i].values.size() == model[i].values.size();
    }
    if (!same) {
      return absl::FailedPreconditionError(
          "the EF21 estimate (from the checkpoint) does not match the model's tensors");
    }
    for (size_t i = 0; i < est.size(); ++i) {
      const auto& add = sum->tensors()[i].values;
      for (size_t j = 0; j < add.size(); ++j) {
        est[i].values[j] += static_cast<float>(add[j] / weight);
      }
    }
    inner_->Accumulate(ClientUpdate::Unnamed(ViewsOf(estimate_), 1), 0);
    return inner_->FinishRound(num_failures, global);
  }

  ParameterSet State() const override {
    ParameterSet s = inner_->State();
    for (const auto& t : estimate_.tensors()) {
      s.Add(Tensor{"ef21/" + t.name, t.shape, t.values}).IgnoreError();
    }
    return s;
  }

  Status Restore(const ParameterSet& state) override {
    auto [inner, own] = SplitState(state, "ef21/");
    RETURN_IF_ERROR(inner_->Restore(inner));
    estimate_ = std::move(own);
    return absl::OkStatus();
  }

  std::map<std::string, double> RoundStats() const override { return inner_->RoundStats(); }

 private:
  std::unique_ptr<Strategy> inner_;
  ParameterSet estimate_;  // H, empty until the first round
  PartialSums sums_;       // this round's weighted sum of increments
};

}  // namespace

double ClipFactor(double norm, double clip) { return norm > clip ? clip / norm : 1.0; }

StatusOr<double> UpdateNoiseMultiplier(double z, double sigma_b) {
  if (!(2 * sigma_b > z)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adaptive clipping: dp.clip_count_stddev ", sigma_b,
        " must exceed dp.noise_multiplier / 2 = ", z / 2));
  }
  return 1.0 / std::sqrt(1.0 / (z * z) - 1.0 / (4 * sigma_b * sigma_b));
}

std::unique_ptr<Strategy> MakeDpStrategy(std::unique_ptr<Strategy> inner, const DpConfig& config,
                                         uint64_t seed) {
  return std::make_unique<DpStrategy>(std::move(inner), config, seed);
}

std::unique_ptr<Strategy> MakeRobustStrategy(std::unique_ptr<Strategy> inner,
                                             const AggregationConfig& config) {
  return std::make_unique<RobustStrategy>(std::move(inner), config);
}

std::unique_ptr<Strategy> MakeEstimateStrategy(std::unique_ptr<Strategy> inner) {
  return std::make_unique<EstimateStrategy>(std::move(inner));
}

}  // namespace cleave
