#include "split/pipeline_schedule.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace cleave {
namespace {

// Rows [m x rows, (m + 1) x rows) of a batch whose first dimension is `batch`.
Activations MicroBatch(const Activations& a, int m, int micro_batches) {
  Activations out;
  out.shape = a.shape;
  out.shape[0] = a.shape[0] / micro_batches;
  const size_t per = a.values.size() / micro_batches;
  out.values.assign(a.values.begin() + m * per, a.values.begin() + (m + 1) * per);
  return out;
}

}  // namespace

std::vector<PipelineOp> PipelineOrder(PipelineSchedule schedule, int holders, int holder, int micro_batches) {
  std::vector<PipelineOp> ops;
  if (schedule == PipelineSchedule::kGpipe) {
    for (int m = 0; m < micro_batches; ++m) ops.push_back({true, m});
    for (int m = 0; m < micro_batches; ++m) ops.push_back({false, m});
    return ops;
  }
  const int warmup = std::min(micro_batches, holders - 1 - holder);
  for (int m = 0; m < warmup; ++m) ops.push_back({true, m});
  for (int m = warmup; m < micro_batches; ++m) {
    ops.push_back({true, m});
    ops.push_back({false, m - warmup});
  }
  for (int m = micro_batches - warmup; m < micro_batches; ++m) ops.push_back({false, m});
  return ops;
}

StatusOr<PipelineStepResult> RunLocalPipelineStep(const std::vector<ModelPart*>& parts, const Activations& input,
                                                  const std::vector<int64_t>& labels, int micro_batches,
                                                  PipelineSchedule schedule) {
  const int holders = static_cast<int>(parts.size());
  const int64_t batch = input.batch();
  if (holders < 1 || micro_batches < 1 || batch % micro_batches != 0 || labels.size() % micro_batches != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a batch of ", batch, " (", labels.size(),
                                                   " labels) does not divide into ", micro_batches,
                                                   " micro-batches"));
  }
  const size_t labels_per = labels.size() / micro_batches;
  std::vector<std::vector<PipelineOp>> order(holders);
  std::vector<size_t> next(holders, 0);
  // What each holder's passes wait for: the activations from the holder before, the
  // gradients from the holder after, by micro-batch.
  std::vector<std::map<int, Activations>> inputs(holders), grads(holders);
  std::vector<int> in_flight(holders, 0);
  PipelineStepResult result;
  result.max_in_flight.assign(holders, 0);
  for (int h = 0; h < holders; ++h) {
    order[h] = PipelineOrder(schedule, holders, h, micro_batches);
    parts[h]->SetAccumulate(micro_batches);
  }
  for (int m = 0; m < micro_batches; ++m) inputs[0][m] = MicroBatch(input, m, micro_batches);
  double loss = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int h = 0; h < holders; ++h) {
      while (next[h] < order[h].size()) {
        const PipelineOp op = order[h][next[h]];
        const bool last = h + 1 == holders;
        if (op.forward) {
          auto in = inputs[h].find(op.micro_batch);
          if (in == inputs[h].end()) break;
          if (last) {  // the loss: forward and backward at once
            const std::vector<int64_t> y(labels.begin() + op.micro_batch * labels_per,
                                         labels.begin() + (op.micro_batch + 1) * labels_per);
            ASSIGN_OR_RETURN(ModelPart::LossStep step, parts[h]->TrainWithLoss(in->second, y));
            loss += step.loss / micro_batches;
            if (h > 0) grads[h - 1][op.micro_batch] = std::move(step.grad_in);
          } else {
            ASSIGN_OR_RETURN(Activations out, parts[h]->Forward(op.micro_batch, in->second));
            inputs[h + 1][op.micro_batch] = std::move(out);
          }
          inputs[h].erase(in);
          result.max_in_flight[h] = std::max(result.max_in_flight[h], ++in_flight[h]);
        } else {
          if (!last) {
            auto g = grads[h].find(op.micro_batch);
            if (g == grads[h].end()) break;
            ASSIGN_OR_RETURN(Activations back, parts[h]->Backward(op.micro_batch, g->second));
            grads[h].erase(g);
            if (h > 0) grads[h - 1][op.micro_batch] = std::move(back);
          }
          --in_flight[h];
        }
        ++next[h];
        progress = true;
      }
    }
  }
  for (int h = 0; h < holders; ++h) {
    if (next[h] != order[h].size()) return absl::InternalError("the pipeline's schedule deadlocked");
  }
  for (ModelPart* part : parts) {
    RETURN_IF_ERROR(part->Step());
    part->SetAccumulate(0);
  }
  result.loss = loss;
  return result;
}

std::vector<std::vector<int>> PackByTokens(const std::vector<int64_t>& lengths, int64_t budget) {
  std::vector<int> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<int>> out;
  int64_t longest = 0;
  for (int i : order) {
    if (out.empty() || static_cast<int64_t>(out.back().size() + 1) * longest > budget) {
      out.emplace_back();
      longest = lengths[i];
    }
    out.back().push_back(i);
  }
  return out;
}

}  // namespace cleave
