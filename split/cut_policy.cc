#include "split/cut_policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/fit.h"
#include "models/part.h"

namespace cleave {
namespace {

double Sum(const std::vector<double>& v, int from, int to) {
  return std::accumulate(v.begin() + from, v.begin() + to, 0.0);
}

int64_t SumBytes(const std::vector<int64_t>& v, int from, int to) {
  return std::accumulate(v.begin() + from, v.begin() + to, int64_t{0});
}

double Seconds(double bytes, double bps) { return bps > 0 ? bytes / bps : 0.0; }

}  // namespace

int64_t StagesMemoryBytes(const CutProblem& p, int begin, int end, int window) {
  const std::vector<int64_t>& trainable = p.trainable_bytes.empty() ? p.param_bytes : p.trainable_bytes;
  const std::vector<int64_t>& kept = p.saved_bytes.empty() ? p.out_bytes : p.saved_bytes;
  const int64_t params = SumBytes(p.param_bytes, begin, end), trains = SumBytes(trainable, begin, end);
  int64_t saved = SumBytes(kept, begin, end);
  if (begin == 0) saved += SumBytes(p.input_bytes, 0, static_cast<int>(p.input_bytes.size()));
  const int w = std::max(1, window);
  return params + (1 + int64_t{p.optimizer_slots} + w - 1) * trains + int64_t{w} * p.batch * saved;
}

CutPrediction PredictStep(const CutProblem& p, int cut) {
  const int n = p.num_stages();
  const int server_end = p.tail_begin > 0 ? p.tail_begin : n;
  const bool ushaped = p.tail_begin > 0;
  CutPrediction r;
  r.cut = cut;
  r.client_s = Sum(p.client_stage_s, 0, cut) + (ushaped ? Sum(p.client_stage_s, server_end, n) : 0);
  r.server_s = Sum(p.server_stage_s, cut, server_end) * std::max(1.0, p.server_load);
  const int64_t act = p.out_bytes[cut - 1] * p.batch;
  double up = act * p.activation_bytes_factor, down = act * p.gradient_bytes_factor;
  int round_trips = 1;
  if (ushaped) {  // server output down, its gradient up; labels stay on the client
    const int64_t mid = p.out_bytes[server_end - 1] * p.batch;
    up += mid * p.gradient_bytes_factor;
    down += mid * p.activation_bytes_factor;
    round_trips = 2;
  } else {
    up += 8.0 * p.batch;  // labels
  }
  r.up_s = Seconds(up, p.up_bps);
  r.down_s = Seconds(down, p.down_bps);
  const double chain = r.client_s + r.up_s + r.server_s + r.down_s + round_trips * p.rtt_s;
  const int w = std::max(1, p.window);
  r.step_s = w == 1 ? chain
                    : std::max({r.client_s, r.up_s, r.server_s, r.down_s, chain / w});

  // Client memory (see the header): its stages [0, cut) and, U-shaped, [server_end, n).
  r.client_memory_bytes = StagesMemoryBytes(p, 0, cut, w);
  if (ushaped) {
    r.client_memory_bytes += StagesMemoryBytes(p, server_end, n, w) +
                             int64_t{w} * p.batch * p.out_bytes[server_end - 1];
  }
  // Message size is judged uncompressed: a codec never makes a tensor larger.
  r.message_bytes = std::max(act, ushaped ? p.out_bytes[server_end - 1] * p.batch : 0);
  if (p.memory_limit_bytes > 0 && r.client_memory_bytes > p.memory_limit_bytes) {
    r.fits = false;
    r.why_not = absl::StrCat("needs ", r.client_memory_bytes, " bytes of client memory, limit ",
                             p.memory_limit_bytes);
  } else if (r.message_bytes > p.max_message_bytes) {
    r.fits = false;
    r.why_not = absl::StrCat("a micro-batch of activations is ", r.message_bytes,
                             " bytes, the message limit ", p.max_message_bytes);
  }
  if (cut < static_cast<int>(p.leakage.size())) r.leakage = p.leakage[cut];
  if (r.fits && p.max_leakage > 0 && r.leakage > p.max_leakage) {
    r.fits = false;
    r.why_not = absl::StrFormat("the server's own attack measures %.3f at cut %d, above %s %g", r.leakage, cut,
                                p.leakage_key, p.max_leakage);
  }
  return r;
}

CutProblem ModelCutProblem(const std::vector<StageProfile>& stages,
                           const std::vector<int64_t>& sample_shape, const TrainConfig& train,
                           int window) {
  CutProblem p;
  p.client_stage_s.assign(stages.size(), 0.0);
  int64_t in = 4;
  for (int64_t d : sample_shape) in *= d;
  p.input_bytes = {in};
  for (const StageProfile& st : stages) {
    p.server_stage_s.push_back(st.seconds);
    p.param_bytes.push_back(4 * st.param_elements + st.quantized_bytes);
    p.trainable_bytes.push_back(4 * st.trainable_elements);
    p.saved_bytes.push_back(st.saved_bytes);
    p.out_bytes.push_back(4 * st.out_elements);
  }
  p.optimizer_slots = train.optimizer != "sgd" ? 2 : train.momentum != 0 ? 1 : 0;
  p.batch = train.batch_size;
  p.window = window;
  return p;
}

namespace {

class CostModelPolicy : public CutPolicy {
 public:
  std::string name() const override { return "cost-model"; }
  StatusOr<CutPrediction> Choose(const CutProblem& p) override {
    const int server_end = p.tail_begin > 0 ? p.tail_begin : p.num_stages();
    bool any = false;
    CutPrediction best;
    std::string why;
    for (int c = 1; c < server_end; ++c) {
      CutPrediction r = PredictStep(p, c);
      if (!r.fits) {
        why = r.why_not;
        continue;
      }
      if (!any || r.step_s < best.step_s) best = r;
      any = true;
    }
    if (!any) {
      return absl::FailedPreconditionError(absl::StrCat("no cut fits this client: ", why));
    }
    return best;
  }
};

class FixedPolicy : public CutPolicy {
 public:
  explicit FixedPolicy(int cut) : cut_(cut) {}
  std::string name() const override { return absl::StrCat("fixed-", cut_); }
  StatusOr<CutPrediction> Choose(const CutProblem& p) override {
    const int server_end = p.tail_begin > 0 ? p.tail_begin : p.num_stages();
    if (cut_ < 1 || cut_ >= server_end) {
      return absl::InvalidArgumentError(
          absl::StrCat("split.cut ", cut_, " is not in [1, ", server_end - 1, "]"));
    }
    CutPrediction r = PredictStep(p, cut_);
    if (!r.fits) {
      return absl::FailedPreconditionError(absl::StrCat("cut ", cut_, ": ", r.why_not));
    }
    return r;
  }

 private:
  int cut_;
};

}  // namespace

std::unique_ptr<CutPolicy> MakeCostModelPolicy() { return std::make_unique<CostModelPolicy>(); }
std::unique_ptr<CutPolicy> MakeFixedPolicy(int cut) { return std::make_unique<FixedPolicy>(cut); }

void CutFeedback::Observe(const CutPrediction& predicted, double client_s, double transfer_s,
                          double server_s, double smoothing) {
  auto update = [&](double& scale, double measured, double predicted_s) {
    // The prediction was made with `scale` applied; the raw model predicts predicted_s/scale.
    if (!(predicted_s > 1e-9) || !(measured >= 0) || !std::isfinite(measured)) return;
    const double ratio = std::clamp(measured / (predicted_s / scale), 0.01, 100.0);
    scale = observations == 0 ? ratio : (1 - smoothing) * scale + smoothing * ratio;
  };
  update(client_scale, client_s, predicted.client_s);
  update(transfer_scale, transfer_s, predicted.up_s + predicted.down_s);
  update(server_scale, server_s, predicted.server_s);
  ++observations;
}

CutProblem CutFeedback::Apply(CutProblem p) const {
  for (double& s : p.client_stage_s) s *= client_scale;
  for (double& s : p.server_stage_s) s *= server_scale;
  if (p.up_bps > 0) p.up_bps /= transfer_scale;
  if (p.down_bps > 0) p.down_bps /= transfer_scale;
  p.rtt_s *= transfer_scale;
  return p;
}

StatusOr<TrainingCost> WholeModelCost(const ModelSpec& spec, const std::vector<int64_t>& sample_shape,
                                      const FitSettings& fit, int reps) {
  ASSIGN_OR_RETURN(std::vector<StageProfile> stages,
                   ProfileStages(spec, sample_shape, fit.batch_size, reps, fit.recompute));
  TrainConfig train;
  train.optimizer = fit.optimizer;
  train.momentum = fit.momentum;
  train.batch_size = fit.batch_size;
  const CutProblem p = ModelCutProblem(stages, sample_shape, train, 1);
  TrainingCost cost;
  cost.memory_bytes = StagesMemoryBytes(p, 0, p.num_stages());
  for (int64_t b : p.param_bytes) cost.memory_bytes += b;
  for (const StageProfile& s : stages) cost.seconds += s.seconds;
  return cost;
}

}  // namespace cleave
