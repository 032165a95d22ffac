// The pipeline planner (split/pipeline_plan.h, issue 38) against an exhaustive search,
// and against the plan a person writes by hand (every device, an equal share of the
// stages), on random cases with a 10x spread of device compute and of uplinks.
//
//   bench_pipeline_plan [CASES [SEED]]   (default 200 1)
//
// Small cases (6 to 12 stages, up to 5 devices of which at most 4 in a chain, batch 16
// in 1 to 16 micro-batches, a third of them with memory limits) go to both searches;
// prints the planner's step over the exhaustive best (worst, mean) and the time each
// took. Then decoder-sized cases (32 blocks, 6 devices) against the equal split: the
// planner's speed-up over it, by the cost model.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "split/pipeline_plan.h"

namespace {

using cleave::ChainDevice;
using cleave::PipelineProblem;

PipelineProblem RandomCase(std::mt19937& rng, int stages, int devices) {
  std::uniform_real_distribution<double> unit(0, 1);
  PipelineProblem p;
  cleave::CutProblem& m = p.model;
  for (int s = 0; s < stages; ++s) {
    m.client_stage_s.push_back(0.05 * (0.5 + unit(rng)));  // a batch's forward and backward
    m.server_stage_s.push_back(m.client_stage_s.back() / 4);
    m.out_bytes.push_back(static_cast<int64_t>((1 << 18) * (0.5 + unit(rng))));
    m.param_bytes.push_back(static_cast<int64_t>((8 << 20) * (0.5 + unit(rng))));
  }
  m.input_bytes = {1024};
  m.batch = 16;
  m.optimizer_slots = 2;
  m.server_load = 2;  // the server serves other chains too
  const bool limited = unit(rng) < 1.0 / 3;
  for (int d = 0; d < devices; ++d) {
    ChainDevice dev;
    dev.name = "d" + std::to_string(d);
    dev.speed = std::pow(10, unit(rng));        // 1x to 10x
    dev.up_bps = 1.25e6 * std::pow(10, unit(rng));  // 10 to 100 Mbit/s
    dev.down_bps = 4 * dev.up_bps;
    dev.rtt_s = 0.005;
    if (limited) dev.memory_limit_bytes = static_cast<int64_t>((stages * (40 << 20) / 2) * (0.5 + unit(rng)));
    p.devices.push_back(dev);
  }
  p.max_devices = 4;
  p.micro_batches = {1, 2, 4, 8, 16};
  return p;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 200;
  std::mt19937 rng(argc > 2 ? std::atoi(argv[2]) : 1);
  double worst = 1, sum = 0, planner_s = 0, exhaustive_s = 0;
  int compared = 0, infeasible = 0;
  for (int c = 0; c < cases; ++c) {
    PipelineProblem p = RandomCase(rng, 6 + c % 7, 3 + c % 3);
    auto t0 = std::chrono::steady_clock::now();
    auto plan = cleave::PlanPipeline(p);
    planner_s += Seconds(t0);
    t0 = std::chrono::steady_clock::now();
    auto best = cleave::PlanPipelineExhaustively(p);
    exhaustive_s += Seconds(t0);
    if (plan.ok() != best.ok()) {
      std::fprintf(stderr, "case %d: the planner found %s, the exhaustive search %s\n", c,
                   plan.ok() ? "a plan" : "none", best.ok() ? "one" : "none");
      return 1;
    }
    if (!best.ok()) {
      ++infeasible;
      continue;
    }
    const double ratio = plan->step_s / best->step_s;
    worst = std::max(worst, ratio);
    sum += ratio;
    ++compared;
  }
  std::printf("small cases: %d compared (%d fit no plan), planner / exhaustive best step: worst %.4fx, mean %.4fx "
              "(target <= 1.10x)\n",
              compared, infeasible, worst, sum / std::max(1, compared));
  std::printf("time: planner %.1f ms a case, exhaustive %.1f ms a case\n", 1e3 * planner_s / cases,
              1e3 * exhaustive_s / cases);

  double speedup_sum = 0, speedup_min = 1e9, speedup_max = 0;
  int decoders = 0;
  for (int c = 0; c < 20; ++c) {
    PipelineProblem p = RandomCase(rng, 32, 6);
    for (auto& d : p.devices) d.memory_limit_bytes = 0;
    auto plan = cleave::PlanPipeline(p);
    double equal = 1e300;
    for (int m : p.micro_batches) {
      auto e = cleave::EqualSplitPlan(p, m);
      if (e.ok()) equal = std::min(equal, e->step_s);
    }
    if (!plan.ok() || equal == 1e300) continue;
    const double s = equal / plan->step_s;
    speedup_sum += s;
    speedup_min = std::min(speedup_min, s);
    speedup_max = std::max(speedup_max, s);
    ++decoders;
  }
  std::printf("32-stage cases, 6 devices: planner's speed-up over an equal split of the stages over 4 devices "
              "(its best M): mean %.2fx, %.2fx to %.2fx over %d cases\n",
              speedup_sum / std::max(1, decoders), speedup_min, speedup_max, decoders);
  return 0;
}
