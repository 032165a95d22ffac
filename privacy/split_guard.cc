#include "privacy/split_guard.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/cord.h"
#include "absl/strings/str_format.h"

namespace cleave {
namespace {

double Norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// The angle between two vectors, in radians (0 when either is zero).
double Angle(const std::vector<double>& a, const std::vector<double>& b) {
  const double na = Norm(a), nb = Norm(b);
  if (na == 0 || nb == 0 || a.size() != b.size()) return 0;
  double dot = 0;
  for (size_t i = 0; i < a.size(); ++i) dot += a[i] * b[i];
  return std::acos(std::clamp(dot / (na * nb), -1.0, 1.0));
}

std::vector<double> Mean(const GradientSet& s) {
  std::vector<double> m = s.sum;
  for (double& x : m) x /= s.weight;
  return m;
}

uint64_t OsSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace

void GradientSet::Add(const std::vector<float>& g) {
  if (sum.empty()) sum.assign(g.size(), 0);
  const double w = 1 / scale;
  double sq = 0;
  for (size_t i = 0; i < g.size() && i < sum.size(); ++i) {
    sum[i] += w * g[i];
    sq += static_cast<double>(g[i]) * g[i];
  }
  norm_sum += w * std::sqrt(sq);
  weight += w;
  ++n;
}

void GradientSet::Decay(double factor) {
  scale *= factor;
  if (scale > 1e-100) return;
  for (double& x : sum) x *= scale;  // before 1 / scale overflows: the sums at their worth
  norm_sum *= scale;
  weight *= scale;
  scale = 1;
}

double SplitGuardScore(const GradientSet& fakes, const GradientSet& controls, const GradientSet& regulars,
                       double mult, double exp) {
  if (fakes.n == 0 || controls.n == 0 || regulars.n == 0) return 1;
  const std::vector<double> f = Mean(fakes), c = Mean(controls), r = Mean(regulars);
  const double fake_gap = std::abs(fakes.mean_norm() - regulars.mean_norm());
  const double control_gap = std::abs(controls.mean_norm() - regulars.mean_norm());
  const double d = fake_gap + control_gap;
  if (d == 0) return 1;
  const double x = Angle(f, r) * fake_gap / d - Angle(c, r) * control_gap / d;
  return std::pow(1 / (1 + std::exp(-mult * x)), exp);
}

constexpr char kVerdict[] = "cleave.dev/split-guard";

bool IsSplitGuardVerdict(const Status& s) {
  return s.code() == absl::StatusCode::kPermissionDenied && s.GetPayload(kVerdict).has_value();
}

SplitGuard::SplitGuard(const SplitGuardOptions& options)
    : o_(options), rng_(options.seed != 0 ? options.seed : OsSeed()) {}

bool SplitGuard::NextIsFake() {
  return ++seen_ > o_.warmup && std::uniform_real_distribution<double>(0, 1)(rng_) < o_.fake_rate;
}

void SplitGuard::Fake(int64_t classes, std::vector<int64_t>* labels) {
  if (classes < 2) return;
  const int64_t offset = std::uniform_int_distribution<int64_t>(1, classes - 1)(rng_);
  std::bernoulli_distribution move(o_.fake_share);
  for (int64_t& y : *labels) {
    if (y >= 0 && y < classes && move(rng_)) y = (y + offset) % classes;
  }
}

double SplitGuard::mean_score() const {
  if (scores_.empty()) return 1;
  double sum = 0;
  for (double s : scores_) sum += s;
  return sum / static_cast<double>(scores_.size());
}

Status SplitGuard::Add(bool fake, const std::vector<float>& gradient) {
  if (gradient.empty()) return absl::OkStatus();  // nothing of the part trains
  if (seen_ <= o_.warmup) return absl::OkStatus();
  if (o_.memory > 0) {
    const double factor = 1 - 1.0 / o_.memory;
    for (GradientSet* s : {&fakes_, &controls_, &regulars_}) s->Decay(factor);
  }
  if (!fake) {
    // A control with chance rate / (1 - rate): as many controls as fakes, on average.
    const double control = std::min(1.0, o_.fake_rate / std::max(1e-9, 1 - o_.fake_rate));
    (std::bernoulli_distribution(control)(rng_) ? controls_ : regulars_).Add(gradient);
    return absl::OkStatus();
  }
  fakes_.Add(gradient);
  if (controls_.n == 0 || regulars_.n == 0) return absl::OkStatus();
  scores_.push_back(SplitGuardScore(fakes_, controls_, regulars_, o_.mult, o_.exp));
  if (static_cast<int>(scores_.size()) > std::max(1, o_.min_fakes)) scores_.pop_front();
  if (static_cast<int>(scores_.size()) >= o_.min_fakes && mean_score() < o_.threshold) {
    Status verdict = absl::PermissionDeniedError(absl::StrFormat(
        "SplitGuard: the server's gradients do not depend on the labels this device sends (mean score %.3f over "
        "the last %d of %d fake micro-batches, under %.2f): training hijacking suspected; this device stops training "
        "with it",
        mean_score(), scores_.size(), fakes_.n, o_.threshold));
    verdict.SetPayload(kVerdict, absl::Cord("1"));
    return verdict;
  }
  return absl::OkStatus();
}

}  // namespace cleave
