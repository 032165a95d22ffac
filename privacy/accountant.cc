#include "privacy/accountant.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace cleave::dp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log(exp(a) + exp(b)).
double LogAdd(double a, double b) {
  if (a == -kInf) return b;
  if (b == -kInf) return a;
  const double hi = std::max(a, b), lo = std::min(a, b);
  return hi + std::log1p(std::exp(lo - hi));
}

// log(exp(a) - exp(b)), a >= b.
double LogSub(double a, double b) {
  if (b == -kInf) return a;
  if (a <= b) return -kInf;
  return std::log(std::expm1(a - b)) + b;
}

// log(erfc(x)), accurate where erfc underflows (a Laurent series at infinity).
double LogErfc(double x) {
  const double r = std::erfc(x);
  if (r > 0) return std::log(r);
  return -std::log(M_PI) / 2 - std::log(x) - x * x - 0.5 / (x * x) + 0.625 / std::pow(x, 4) -
         37.0 / 24.0 / std::pow(x, 6) + 353.0 / 64.0 / std::pow(x, 8);
}

double LogBinom(int n, int k) {
  return std::lgamma(n + 1.0) - std::lgamma(k + 1.0) - std::lgamma(n - k + 1.0);
}

// log(A_alpha) for integer alpha: a finite sum.
double LogAInt(double q, double sigma, int alpha) {
  double log_a = -kInf;
  for (int i = 0; i <= alpha; ++i) {
    const double log_coef = LogBinom(alpha, i) + i * std::log(q) + (alpha - i) * std::log1p(-q);
    log_a = LogAdd(log_a, log_coef + (static_cast<double>(i) * i - i) / (2 * sigma * sigma));
  }
  return log_a;
}

// log(A_alpha) for fractional alpha: two series, summed until their terms are negligible.
double LogAFrac(double q, double sigma, double alpha) {
  double log_a0 = -kInf, log_a1 = -kInf;
  const double z0 = sigma * sigma * std::log(1 / q - 1) + 0.5;
  double coef = 1;  // binom(alpha, i), built up term by term (it may be negative)
  for (int i = 0;; ++i) {
    if (i > 0) coef *= (alpha - (i - 1)) / i;
    const double log_coef = std::log(std::abs(coef));
    const double j = alpha - i;
    const double log_t0 = log_coef + i * std::log(q) + j * std::log1p(-q);
    const double log_t1 = log_coef + j * std::log(q) + i * std::log1p(-q);
    const double log_e0 = std::log(0.5) + LogErfc((i - z0) / (std::sqrt(2.0) * sigma));
    const double log_e1 = std::log(0.5) + LogErfc((z0 - j) / (std::sqrt(2.0) * sigma));
    const double log_s0 = log_t0 + (static_cast<double>(i) * i - i) / (2 * sigma * sigma) + log_e0;
    const double log_s1 = log_t1 + (j * j - j) / (2 * sigma * sigma) + log_e1;
    if (coef > 0) {
      log_a0 = LogAdd(log_a0, log_s0);
      log_a1 = LogAdd(log_a1, log_s1);
    } else {
      log_a0 = LogSub(log_a0, log_s0);
      log_a1 = LogSub(log_a1, log_s1);
    }
    if (std::max(log_s0, log_s1) < -30 || i > 100000) break;
  }
  return LogAdd(log_a0, log_a1);
}

double RdpOneStep(double q, double sigma, double alpha) {
  if (q == 0) return 0;
  if (q == 1) return alpha / (2 * sigma * sigma);
  const double log_a = alpha == std::floor(alpha) ? LogAInt(q, sigma, static_cast<int>(alpha))
                                                  : LogAFrac(q, sigma, alpha);
  return log_a / (alpha - 1);
}

}  // namespace

std::vector<double> DefaultOrders() {
  std::vector<double> orders;
  for (int x = 1; x < 100; ++x) orders.push_back(1 + x / 10.0);
  for (int a = 12; a < 64; ++a) orders.push_back(a);
  return orders;
}

StatusOr<std::vector<double>> ComputeRdp(double q, double noise_multiplier, int64_t steps,
                                         const std::vector<double>& orders) {
  if (!(q >= 0 && q <= 1)) return absl::InvalidArgumentError("sampling rate must be in [0, 1]");
  if (!(noise_multiplier > 0)) return absl::InvalidArgumentError("noise multiplier must be > 0");
  if (steps < 0) return absl::InvalidArgumentError("steps must be >= 0");
  std::vector<double> rdp;
  for (double a : orders) {
    if (!(a > 1)) return absl::InvalidArgumentError(absl::StrCat("order ", a, " is not > 1"));
    rdp.push_back(RdpOneStep(q, noise_multiplier, a) * steps);
  }
  return rdp;
}

StatusOr<Epsilon> EpsilonFromRdp(const std::vector<double>& orders, const std::vector<double>& rdp,
                                 double delta) {
  if (!(delta > 0 && delta < 1)) return absl::InvalidArgumentError("delta must be in (0, 1)");
  if (orders.size() != rdp.size() || orders.empty()) {
    return absl::InvalidArgumentError("one RDP value per order");
  }
  Epsilon best{kInf, orders[0]};
  for (size_t i = 0; i < orders.size(); ++i) {
    const double a = orders[i], r = rdp[i];
    if (r < 0) return absl::InvalidArgumentError("RDP must be >= 0");
    double eps;
    if (delta * delta + std::expm1(-r) >= 0) {
      eps = 0;  // bounded through the KL divergence: delta <= sqrt(1 - exp(-r))
    } else if (a > 1.01) {
      eps = r + std::log1p(-1 / a) - std::log(delta * a) / (a - 1);
    } else {
      eps = kInf;
    }
    if (eps < best.epsilon) best = {eps, a};
  }
  best.epsilon = std::max(0.0, best.epsilon);
  return best;
}

StatusOr<Epsilon> ComputeEpsilon(double q, double noise_multiplier, int64_t steps, double delta,
                                 const std::vector<double>& orders) {
  ASSIGN_OR_RETURN(auto rdp, ComputeRdp(q, noise_multiplier, steps, orders));
  return EpsilonFromRdp(orders, rdp, delta);
}

}  // namespace cleave::dp
