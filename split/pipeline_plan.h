// Planning a pipeline across a chain of devices (issue 38): which devices form the
// chain, which contiguous stages each holds, and how many micro-batches a batch is cut
// into, from measured compute, memory and links. No LibTorch here: profiles come in as
// numbers, as for the cut policy (split/cut_policy.h), whose CutProblem describes the
// model.
//
// The chain: device chain[0] (the data owner) holds stages [bounds[0] = 0, bounds[1]),
// device chain[i] holds [bounds[i], bounds[i + 1]), and the server holds the rest,
// [bounds[K], n), with the loss. A batch of `batch` samples goes through as M
// micro-batches of batch / M; the weights step once, after the batch (GPipe and 1F1B
// alike), so no weights are stashed.
//
// The cost model, per micro-batch: device i computes its stages' forward and backward
// passes in (sum of client_stage_s) x (1 / M) / speed_i; the server its stages' in
// (sum of server_stage_s) x (1 / M) x server_load; each hop carries the activations
// forward (bytes out of its last stage x activation_bytes_factor) over the sender's
// uplink and the receiver's downlink (the slower of the two; the server's own links are
// taken as free), and their gradients back the other way, the two directions at once,
// so a hop takes the slower direction. Each device, hop and the server is a resource a
// micro-batch passes in order; with P resources taking t_1..t_P the batch takes
//   sum of t_j + (M - 1) x max of t_j + 2 x rtt per hop,
// the pipeline's fill and drain plus M - 1 more micro-batches at the slowest resource's
// pace (the same for GPipe and 1F1B). Memory on device i: its stages' parameters, a
// gradient and the optimizer's state for those that train, and what each micro-batch in
// flight keeps for its backward pass: all M under GPipe, at most K + 1 - i under 1F1B
// (a device waits for as many backward passes as there are holders after it).
//
// U-shaped (model.tail_begin > 0): the server holds [bounds[K], tail_begin) and the data
// owner also the head [tail_begin, n): its compute and memory count on the owner, and
// every hop also carries the head's input down and its gradient up (two round trips).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "split/cut_policy.h"

namespace cleave {

struct ChainDevice {
  std::string name;
  double speed = 1;                // compute, relative to client_stage_s's device
  double up_bps = 0, down_bps = 0; // bytes/s; 0 = not limited
  double rtt_s = 0;
  int64_t memory_limit_bytes = 0;  // 0 = no limit
};

enum class PipelineSchedule { kGpipe, k1f1b };

struct PipelineProblem {
  CutProblem model;                  // its client_stage_s, server_stage_s, bytes, batch
  std::vector<ChainDevice> devices;  // devices[0] is the data owner
  int max_devices = 4;               // at most this many in the chain
  int min_devices = 1;               // and at least this many
  int server_begin = 0;              // > 0: the server's stages start here (bounds.back())
  std::vector<int> micro_batches = {1, 2, 4, 8, 16};  // M to choose from (dividing batch)
  PipelineSchedule schedule = PipelineSchedule::k1f1b;
};

struct PipelinePlan {
  // The choices alone, for PredictPipeline.
  static PipelinePlan Of(std::vector<int> chain, std::vector<int> bounds, int micro_batches) {
    PipelinePlan plan;
    plan.chain = std::move(chain);
    plan.bounds = std::move(bounds);
    plan.micro_batches = micro_batches;
    return plan;
  }

  std::vector<int> chain;    // indices into devices, chain[0] = 0
  std::vector<int> bounds;   // chain.size() + 1 entries: device i holds [bounds[i], bounds[i + 1])
  int micro_batches = 1;
  double step_s = 0;         // one batch, by the cost model
  std::vector<double> resource_s;  // per micro-batch: device 0, hop 0, device 1, ..., the server
  double bottleneck_s = 0;   // the largest of resource_s
  std::vector<int64_t> memory_bytes;  // per device of the chain
  // The share of the batch's time each device computes (M x its time / step_s).
  std::vector<double> busy;
};

// The cost model above for one plan (chain, bounds, micro_batches set; the rest filled
// in). INVALID_ARGUMENT for an ill-formed plan (a device twice, the owner not first,
// bounds not increasing from 0, the server left nothing or not starting at server_begin,
// M not dividing the batch);
// FAILED_PRECONDITION naming the device whose memory it exceeds.
StatusOr<PipelinePlan> PredictPipeline(const PipelineProblem& p, PipelinePlan plan);

// The planner: for each M, each chain (the owner first, then every ordered choice of the
// others up to max_devices while there are at most 2,000 of them, else the fastest
// first), the segment bounds by dynamic programming (the least bottleneck, then the
// least total time under each of a ladder of bottlenecks above it); the plan the cost
// model puts fastest. FAILED_PRECONDITION when no plan fits the devices' memory.
StatusOr<PipelinePlan> PlanPipeline(const PipelineProblem& p);

// Every chain, every bounds and every M, for tests and the benchmark on small cases.
StatusOr<PipelinePlan> PlanPipelineExhaustively(const PipelineProblem& p);

// The plan a person would write by hand: every device in the given order (up to
// max_devices), the stages before the server's last one (with server_begin, before it)
// shared out as evenly as their count allows, M = `m`.
StatusOr<PipelinePlan> EqualSplitPlan(const PipelineProblem& p, int m);

}  // namespace cleave
