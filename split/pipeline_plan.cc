#include "split/pipeline_plan.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"

namespace cleave {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Where the server's stages end: the model's last stage, or U-shaped the head's first.
int ServerEnd(const PipelineProblem& p) {
  const int n = p.model.num_stages();
  return p.model.tail_begin > 0 && p.model.tail_begin < n ? p.model.tail_begin : n;
}

double StageSum(const std::vector<double>& v, int begin, int end) {
  double s = 0;
  for (int i = begin; i < end; ++i) s += v[i];
  return s;
}

// Seconds for `bytes` over the slower of two links (0 = not limited).
double Transfer(double bytes, double a_bps, double b_bps) {
  double bps = kInf;
  if (a_bps > 0) bps = std::min(bps, a_bps);
  if (b_bps > 0) bps = std::min(bps, b_bps);
  return std::isinf(bps) ? 0 : bytes / bps;
}

// The pieces of the cost model for one chain and M, shared by the prediction and the
// searches.
class ChainCosts {
 public:
  ChainCosts(const PipelineProblem& p, const std::vector<int>& chain, int m)
      : p_(p), chain_(chain), k_(static_cast<int>(chain.size())), m_(m), micro_(p.model), weights_only_(p.model) {
    micro_.batch = std::max(1, p.model.batch / m);
    weights_only_ = micro_;
    weights_only_.batch = 0;
  }

  // The server's stages end here: the head's first stage when U-shaped.
  int stages() const { return ServerEnd(p_); }
  int server_begin() const { return p_.server_begin; }

  // Device i (of the chain) computing [a, b), per micro-batch; U-shaped, the owner (0)
  // also computes the head.
  double Compute(int i, int a, int b) const {
    const double head = i == 0 ? StageSum(p_.model.client_stage_s, stages(), p_.model.num_stages()) : 0;
    return (StageSum(p_.model.client_stage_s, a, b) + head) / m_ / Device(i).speed;
  }
  // The hop out of device i whose stages end at b, per micro-batch. U-shaped, every hop
  // also carries the head's input back to the owner and its gradient up to the server.
  double Hop(int i, int b) const {
    const double act = static_cast<double>(p_.model.out_bytes[b - 1]) * micro_.batch;
    const double head = stages() < p_.model.num_stages()
                            ? static_cast<double>(p_.model.out_bytes[stages() - 1]) * micro_.batch
                            : 0;
    const double up = act * p_.model.activation_bytes_factor + head * p_.model.gradient_bytes_factor;
    const double down = act * p_.model.gradient_bytes_factor + head * p_.model.activation_bytes_factor;
    const ChainDevice& from = Device(i);
    if (i + 1 == k_) {  // to the server, whose own links are free
      return std::max(Transfer(up, from.up_bps, 0), Transfer(down, 0, from.down_bps));
    }
    const ChainDevice& to = Device(i + 1);
    return std::max(Transfer(up, from.up_bps, to.down_bps), Transfer(down, to.up_bps, from.down_bps));
  }
  // A hop's round trips per batch: U-shaped, a micro-batch crosses each hop twice each way.
  double Rtt(int i) const {
    const double rtt = i + 1 == k_ ? Device(i).rtt_s : std::max(Device(i).rtt_s, Device(i + 1).rtt_s);
    return stages() < p_.model.num_stages() ? 2 * rtt : rtt;
  }
  double Server(int b) const {
    return StageSum(p_.model.server_stage_s, b, stages()) / m_ * std::max(1.0, p_.model.server_load);
  }
  // Device i's memory holding [a, b): one micro-batch's as the cut policy counts it, plus
  // what each further micro-batch in flight keeps; U-shaped, the owner also holds the head
  // (one micro-batch at a time: its forward and backward run back to back).
  int64_t Memory(int i, int a, int b) const {
    const int in_flight = p_.schedule == PipelineSchedule::kGpipe ? m_ : std::min(m_, k_ + 1 - i);
    const int64_t one = StagesMemoryBytes(micro_, a, b, 1);
    const int64_t kept = one - StagesMemoryBytes(weights_only_, a, b, 1);  // one micro-batch's
    const int64_t head = i == 0 && stages() < p_.model.num_stages()
                             ? StagesMemoryBytes(micro_, stages(), p_.model.num_stages(), 1)
                             : 0;
    return one + int64_t{in_flight - 1} * kept + head;
  }
  bool Fits(int i, int a, int b) const {
    const int64_t limit = Device(i).memory_limit_bytes;
    return limit <= 0 || Memory(i, a, b) <= limit;
  }

 private:
  const ChainDevice& Device(int i) const { return p_.devices[chain_[i]]; }

  const PipelineProblem& p_;
  const std::vector<int>& chain_;
  int k_, m_;
  CutProblem micro_;         // the model with batch = one micro-batch
  CutProblem weights_only_;  // with no samples: parameters, gradients, optimizer state
};

Status CheckProblem(const PipelineProblem& p) {
  const int n = p.model.num_stages();
  if (n < 2 || static_cast<int>(p.model.server_stage_s.size()) != n ||
      static_cast<int>(p.model.out_bytes.size()) != n || static_cast<int>(p.model.param_bytes.size()) != n) {
    return absl::InvalidArgumentError("a pipeline needs a model of two stages or more, each profiled");
  }
  if (p.devices.empty()) return absl::InvalidArgumentError("a pipeline needs its data owner");
  for (const ChainDevice& d : p.devices) {
    if (!(d.speed > 0)) return absl::InvalidArgumentError(absl::StrCat("device ", d.name, ": speed must be > 0"));
  }
  if (p.max_devices < 1 || p.min_devices < 1 || p.min_devices > p.max_devices) {
    return absl::InvalidArgumentError("1 <= min_devices <= max_devices");
  }
  if (p.model.tail_begin > 0 && p.model.tail_begin < 2) {
    return absl::InvalidArgumentError("a U-shaped pipeline leaves the chain and the server a stage each");
  }
  if (p.server_begin < 0 || p.server_begin >= ServerEnd(p)) {
    return absl::InvalidArgumentError(absl::StrCat("server_begin ", p.server_begin, " is not a stage the server can start at"));
  }
  return absl::OkStatus();
}

std::vector<int> MicroBatches(const PipelineProblem& p) {
  std::vector<int> out;
  for (int m : p.micro_batches) {
    if (m >= 1 && m <= p.model.batch && p.model.batch % m == 0) out.push_back(m);
  }
  return out;
}

// Every chain: the owner, then ordered choices of the others (all of them up to
// max_devices while they number at most `limit`; else the fastest first, one chain per
// length).
std::vector<std::vector<int>> Chains(const PipelineProblem& p, size_t limit) {
  const int others = static_cast<int>(p.devices.size()) - 1;
  const int longest = std::min(others, p.max_devices - 1);
  double count = 1, perms = 1;
  for (int k = 1; k <= longest; ++k) count += (perms *= others - k + 1);
  std::vector<std::vector<int>> out;
  if (count > static_cast<double>(limit)) {
    std::vector<int> order;
    for (int i = 1; i <= others; ++i) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return p.devices[a].speed > p.devices[b].speed; });
    for (int k = p.min_devices - 1; k <= longest; ++k) {
      std::vector<int> chain = {0};
      chain.insert(chain.end(), order.begin(), order.begin() + k);
      out.push_back(std::move(chain));
    }
    return out;
  }
  std::vector<int> chain = {0};
  std::vector<bool> used(p.devices.size(), false);
  used[0] = true;
  std::function<void()> extend = [&] {
    if (static_cast<int>(chain.size()) >= p.min_devices) out.push_back(chain);
    if (static_cast<int>(chain.size()) > longest) return;
    for (int d = 1; d <= others; ++d) {
      if (used[d]) continue;
      used[d] = true;
      chain.push_back(d);
      extend();
      chain.pop_back();
      used[d] = false;
    }
  };
  extend();
  return out;
}

// The bounds minimising the total time with no resource above `cap` (kInf: none), by
// dynamic programming over (device, where its stages end); empty if none fits.
std::vector<int> BestBounds(const ChainCosts& c, int k, double cap, bool bottleneck) {
  const int n = c.stages();
  // best[i][b]: devices 0..i-1 placed, device i - 1 ending at b (b = bounds[i]).
  std::vector<std::vector<double>> best(k + 1, std::vector<double>(n, kInf));
  std::vector<std::vector<int>> from(k + 1, std::vector<int>(n, -1));
  best[0][0] = 0;
  for (int i = 0; i < k; ++i) {
    for (int a = i; a < n; ++a) {
      if (std::isinf(best[i][a])) continue;
      for (int b = a + 1; b < n; ++b) {  // the server keeps at least one stage
        if (!c.Fits(i, a, b)) continue;
        const double compute = c.Compute(i, a, b), hop = c.Hop(i, b);
        if (compute > cap || hop > cap) continue;
        const double v = bottleneck ? std::max({best[i][a], compute, hop}) : best[i][a] + compute + hop;
        if (v < best[i + 1][b]) {
          best[i + 1][b] = v;
          from[i + 1][b] = a;
        }
      }
    }
  }
  int end = -1;
  double value = kInf;
  for (int b = k; b < n; ++b) {
    if (std::isinf(best[k][b]) || (c.server_begin() > 0 && b != c.server_begin())) continue;
    const double server = c.Server(b);
    if (server > cap) continue;
    const double v = bottleneck ? std::max(best[k][b], server) : best[k][b] + server;
    if (v < value) {
      value = v;
      end = b;
    }
  }
  if (end < 0) return {};
  std::vector<int> bounds(k + 1);
  bounds[k] = end;
  for (int i = k; i > 0; --i) bounds[i - 1] = from[i][bounds[i]];
  return bounds;
}

bool Better(const PipelinePlan& a, const StatusOr<PipelinePlan>& best) {
  return !best.ok() || a.step_s < best->step_s;
}

}  // namespace

StatusOr<PipelinePlan> PredictPipeline(const PipelineProblem& p, PipelinePlan plan) {
  RETURN_IF_ERROR(CheckProblem(p));
  const int n = ServerEnd(p), k = static_cast<int>(plan.chain.size());
  if (k < 1 || plan.chain[0] != 0) return absl::InvalidArgumentError("the chain must start at the data owner");
  std::set<int> seen;
  for (int d : plan.chain) {
    if (d < 0 || d >= static_cast<int>(p.devices.size()) || !seen.insert(d).second) {
      return absl::InvalidArgumentError(absl::StrCat("device ", d, " is not in the problem or is in the chain twice"));
    }
  }
  if (static_cast<int>(plan.bounds.size()) != k + 1 || plan.bounds[0] != 0) {
    return absl::InvalidArgumentError("bounds must be chain.size() + 1 stages, from 0");
  }
  for (int i = 0; i < k; ++i) {
    if (plan.bounds[i + 1] <= plan.bounds[i]) return absl::InvalidArgumentError("every device must hold a stage");
  }
  if (plan.bounds[k] >= n) return absl::InvalidArgumentError("the server must hold a stage");
  if (p.server_begin > 0 && plan.bounds[k] != p.server_begin) {
    return absl::InvalidArgumentError(absl::StrCat("the server's stages start at ", p.server_begin));
  }
  const int m = plan.micro_batches;
  if (m < 1 || m > p.model.batch || p.model.batch % m != 0) {
    return absl::InvalidArgumentError(absl::StrCat(m, " micro-batches do not divide a batch of ", p.model.batch));
  }
  const ChainCosts c(p, plan.chain, m);
  plan.resource_s.clear();
  plan.memory_bytes.clear();
  plan.busy.clear();
  double rtt = 0;
  for (int i = 0; i < k; ++i) {
    const int a = plan.bounds[i], b = plan.bounds[i + 1];
    plan.memory_bytes.push_back(c.Memory(i, a, b));
    if (!c.Fits(i, a, b)) {
      const ChainDevice& d = p.devices[plan.chain[i]];
      return absl::FailedPreconditionError(absl::StrCat("device ", d.name, " would need ", plan.memory_bytes.back() >> 20,
                                                        " MiB for stages [", a, ", ", b, "), over its ",
                                                        d.memory_limit_bytes >> 20, " MiB"));
    }
    plan.resource_s.push_back(c.Compute(i, a, b));
    plan.resource_s.push_back(c.Hop(i, b));
    rtt += 2 * c.Rtt(i);
  }
  plan.resource_s.push_back(c.Server(plan.bounds[k]));
  double sum = 0;
  plan.bottleneck_s = 0;
  for (double t : plan.resource_s) {
    sum += t;
    plan.bottleneck_s = std::max(plan.bottleneck_s, t);
  }
  plan.step_s = sum + (m - 1) * plan.bottleneck_s + rtt;
  for (int i = 0; i < k; ++i) {
    plan.busy.push_back(plan.step_s > 0 ? m * plan.resource_s[2 * i] / plan.step_s : 0);
  }
  return plan;
}

StatusOr<PipelinePlan> PlanPipeline(const PipelineProblem& p) {
  RETURN_IF_ERROR(CheckProblem(p));
  if (static_cast<int>(p.devices.size()) < p.min_devices) {
    return absl::FailedPreconditionError(absl::StrCat("a chain of ", p.min_devices, " devices, of ",
                                                      p.devices.size(), " available"));
  }
  StatusOr<PipelinePlan> best = absl::FailedPreconditionError(
      "no pipeline fits: every chain leaves some device more stages than its memory holds");
  for (int m : MicroBatches(p)) {
    for (const std::vector<int>& chain : Chains(p, 2000)) {
      const int k = static_cast<int>(chain.size());
      if (k >= ServerEnd(p)) continue;
      const ChainCosts c(p, chain, m);
      const std::vector<int> least = BestBounds(c, k, kInf, /*bottleneck=*/true);
      if (least.empty()) continue;
      auto first = PredictPipeline(p, PipelinePlan::Of(chain, least, m));
      if (!first.ok()) continue;
      if (Better(*first, best)) best = *first;
      // Under each cap a little above the least bottleneck, the least total time.
      for (int step = 0; step <= 20; ++step) {
        const double cap = step == 20 ? kInf : first->bottleneck_s * (1 + 0.05 * step);
        const std::vector<int> bounds = BestBounds(c, k, cap, /*bottleneck=*/false);
        if (bounds.empty()) continue;
        auto plan = PredictPipeline(p, PipelinePlan::Of(chain, bounds, m));
        if (plan.ok() && Better(*plan, best)) best = *plan;
      }
    }
  }
  return best;
}

StatusOr<PipelinePlan> PlanPipelineExhaustively(const PipelineProblem& p) {
  RETURN_IF_ERROR(CheckProblem(p));
  const int n = ServerEnd(p);
  StatusOr<PipelinePlan> best = absl::FailedPreconditionError("no pipeline fits");
  for (int m : MicroBatches(p)) {
    for (const std::vector<int>& chain : Chains(p, std::numeric_limits<size_t>::max())) {
      const int k = static_cast<int>(chain.size());
      std::vector<int> bounds(k + 1);
      std::function<void(int)> place = [&](int i) {  // bounds[i] for i = 1..k
        if (i > k) {
          auto plan = PredictPipeline(p, PipelinePlan::Of(chain, bounds, m));
          if (plan.ok() && Better(*plan, best)) best = *plan;
          return;
        }
        for (int b = bounds[i - 1] + 1; b <= n - 1 - (k - i); ++b) {
          bounds[i] = b;
          place(i + 1);
        }
      };
      place(1);
    }
  }
  return best;
}

StatusOr<PipelinePlan> EqualSplitPlan(const PipelineProblem& p, int m) {
  RETURN_IF_ERROR(CheckProblem(p));
  const int n = ServerEnd(p);
  PipelinePlan plan;
  plan.micro_batches = m;
  if (p.server_begin > 0) {  // the devices share [0, server_begin)
    const int k = std::min({static_cast<int>(p.devices.size()), p.max_devices, p.server_begin});
    for (int i = 0; i < k; ++i) plan.chain.push_back(i);
    for (int i = 0; i <= k; ++i) plan.bounds.push_back(i * p.server_begin / k);
    return PredictPipeline(p, std::move(plan));
  }
  const int k = std::min({static_cast<int>(p.devices.size()), p.max_devices, n - 1});
  for (int i = 0; i < k; ++i) plan.chain.push_back(i);
  for (int i = 0; i <= k; ++i) plan.bounds.push_back(static_cast<int>(std::lround(double(i) * n / (k + 1))));
  for (int i = 1; i <= k; ++i) plan.bounds[i] = std::max(plan.bounds[i], plan.bounds[i - 1] + 1);
  return PredictPipeline(p, std::move(plan));
}

}  // namespace cleave
