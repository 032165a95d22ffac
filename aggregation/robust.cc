#include "aggregation/robust.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "aggregation/registry.h"

namespace cleave::robust {
namespace {

double SquaredDistance(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]) - b[i];
    d += x * x;
  }
  return d;
}

// Per coordinate, the average of the `keep` values chosen by `pick` from the sorted
// column.
template <class Pick>
std::vector<float> PerCoordinate(const Updates& u, Pick pick) {
  const size_t len = u.empty() ? 0 : u[0].size();
  std::vector<float> out(len);
  std::vector<float> col(u.size());
  for (size_t j = 0; j < len; ++j) {
    for (size_t i = 0; i < u.size(); ++i) col[i] = u[i][j];
    std::sort(col.begin(), col.end());
    out[j] = pick(col);
  }
  return out;
}

float MeanOf(const std::vector<float>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return static_cast<float>(s / (end - begin));
}

}  // namespace

std::vector<float> Mean(const Updates& u) {
  std::vector<float> out(u[0].size(), 0);
  for (size_t j = 0; j < out.size(); ++j) {
    double s = 0;
    for (const auto& x : u) s += x[j];
    out[j] = static_cast<float>(s / u.size());
  }
  return out;
}

float SortedMedian(const std::vector<float>& c) {
  const size_t n = c.size();
  return n % 2 ? c[n / 2] : static_cast<float>((static_cast<double>(c[n / 2 - 1]) + c[n / 2]) / 2);
}

float SortedTrimmedMean(const std::vector<float>& c, int f) { return MeanOf(c, f, c.size() - f); }

std::vector<float> Median(const Updates& u) { return PerCoordinate(u, SortedMedian); }

std::vector<float> TrimmedMean(const Updates& u, int f) {
  return PerCoordinate(u, [f](const std::vector<float>& c) { return SortedTrimmedMean(c, f); });
}

std::vector<int> KrumSelect(const Updates& u, int f, int m) {
  const int n = static_cast<int>(u.size());
  const int closest = std::max(1, n - f - 2);
  std::vector<std::vector<double>> d(n, std::vector<double>(n, 0));
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) d[i][j] = d[j][i] = SquaredDistance(u[i], u[j]);
  }
  std::vector<double> score(n, 0);
  for (int i = 0; i < n; ++i) {
    std::vector<double> others;
    for (int j = 0; j < n; ++j) {
      if (j != i) others.push_back(d[i][j]);
    }
    std::sort(others.begin(), others.end());
    for (int k = 0; k < std::min<int>(closest, others.size()); ++k) score[i] += others[k];
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] < score[b]; });
  order.resize(std::min(m, n));
  return order;
}

std::vector<float> Krum(const Updates& u, int f) { return u[KrumSelect(u, f, 1)[0]]; }

std::vector<float> MultiKrum(const Updates& u, int f, int m) {
  Updates chosen;
  for (int i : KrumSelect(u, f, m)) chosen.push_back(u[i]);
  return Mean(chosen);
}

std::vector<float> Bulyan(const Updates& u, int f) {
  const int n = static_cast<int>(u.size());
  const int theta = n - 2 * f;
  Updates pool = u, selected;
  while (static_cast<int>(selected.size()) < theta) {
    const int best = KrumSelect(pool, f, 1)[0];
    selected.push_back(pool[best]);
    pool.erase(pool.begin() + best);
  }
  const int beta = theta - 2 * f;
  return PerCoordinate(selected, [beta](const std::vector<float>& c) {
    // The beta values closest to the median of the sorted column form a window around it.
    const double median = c.size() % 2 ? c[c.size() / 2]
                                       : (static_cast<double>(c[c.size() / 2 - 1]) + c[c.size() / 2]) / 2;
    size_t lo = 0;
    double best = INFINITY;
    for (size_t s = 0; s + beta <= c.size(); ++s) {
      const double spread = std::max(std::abs(c[s] - median), std::abs(c[s + beta - 1] - median));
      if (spread < best) {
        best = spread;
        lo = s;
      }
    }
    return MeanOf(c, lo, lo + beta);
  });
}

std::vector<float> NormBound(const Updates& u, const std::vector<double>& weights, double max_norm) {
  std::vector<double> acc(u[0].size(), 0);
  double total = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    const double norm = std::sqrt(SquaredDistance(u[i], std::vector<float>(u[i].size(), 0)));
    const double scale = norm > max_norm ? max_norm / norm : 1.0;
    for (size_t j = 0; j < acc.size(); ++j) acc[j] += weights[i] * scale * u[i][j];
    total += weights[i];
  }
  std::vector<float> out(acc.size());
  for (size_t j = 0; j < acc.size(); ++j) out[j] = static_cast<float>(acc[j] / total);
  return out;
}

std::vector<float> FlTrust(const Updates& u, const std::vector<float>& reference) {
  const std::vector<float> zero(reference.size(), 0);
  const double ref_norm = std::sqrt(SquaredDistance(reference, zero));
  std::vector<double> acc(reference.size(), 0);
  double total = 0;
  for (const auto& x : u) {
    const double norm = std::sqrt(SquaredDistance(x, zero));
    if (norm == 0 || ref_norm == 0) continue;
    double dot = 0;
    for (size_t j = 0; j < x.size(); ++j) dot += static_cast<double>(x[j]) * reference[j];
    const double trust = std::max(0.0, dot / (norm * ref_norm));
    for (size_t j = 0; j < x.size(); ++j) acc[j] += trust * ref_norm / norm * x[j];
    total += trust;
  }
  std::vector<float> out(reference.size(), 0);
  if (total > 0) {
    for (size_t j = 0; j < out.size(); ++j) out[j] = static_cast<float>(acc[j] / total);
  }
  return out;
}

StatusOr<std::vector<float>> Aggregate(const std::string& rule, const Updates& u,
                                       const std::vector<double>& weights, int f, int m,
                                       double max_norm, const std::vector<float>& reference) {
  ASSIGN_OR_RETURN(const RuleKind* kind, RobustRules().Get(rule));
  const int n = static_cast<int>(u.size());
  if (m == 0) m = n - f;
  if (n < 1) return Needs(rule, n, f, false, "at least one update");
  if (kind->precondition) RETURN_IF_ERROR(kind->precondition(n, f, m));
  return kind->aggregate(RuleInput{u, weights, f, m, max_norm, reference});
}

Status Needs(const std::string& rule, int n, int f, bool ok, const std::string& what) {
  if (ok) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("aggregation.rule ", rule, " with f = ", f,
                                                    " needs ", what, "; the round has ", n,
                                                    " updates"));
}

}  // namespace cleave::robust
