#include "split/attacks.h"

#include <limits>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "data/dataset.h"

namespace cleave {
namespace {

const Tensor* EndingWith(const ParameterSet& set, const std::string& suffix) {
  for (const Tensor& t : set.tensors()) {
    if (absl::EndsWith(t.name, suffix)) return &t;
  }
  return nullptr;
}

}  // namespace

StatusOr<TokenRecovery> RecoverTokensAtTheEmbedding(const SplitRecord& r) {
  const Tensor* wte = EndingWith(r.part, "wte.weight");
  const Tensor* wpe = EndingWith(r.part, "wpe.weight");
  if (wte == nullptr || wpe == nullptr || wte->shape.size() != 2 || wpe->shape.size() != 2 ||
      wte->shape[1] != wpe->shape[1]) {
    return absl::FailedPreconditionError(
        "the recorded part has no token and position embeddings (wte, wpe): not a decoder cut after its embedding");
  }
  const int64_t vocab = wte->shape[0], context = wpe->shape[0], dim = wte->shape[1];
  std::vector<double> half_norm(vocab, 0);  // ||w_v||^2 / 2
  for (int64_t v = 0; v < vocab; ++v) {
    for (int64_t d = 0; d < dim; ++d) half_norm[v] += 0.5 * wte->values[v * dim + d] * wte->values[v * dim + d];
  }
  TokenRecovery out;
  std::vector<float> a(dim);
  for (const RecordedBatch& b : r.batches) {
    const auto& s = b.activations.shape;
    if (s.size() != 3 || s[2] != dim || s[1] > context) {
      return absl::InvalidArgumentError(absl::StrCat("recorded activations of ", s.size(), " dimensions do not fit an "
                                                     "embedding of width ", dim));
    }
    if (b.labels.empty()) return absl::FailedPreconditionError("the record has no labels to check tokens against");
    const int64_t batch = s[0], tokens = s[1];
    if (static_cast<int64_t>(b.labels.size()) != batch * tokens) {
      return absl::InvalidArgumentError("recorded labels do not fit their activations");
    }
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t t = 1; t < tokens; ++t) {
        const int64_t truth = b.labels[i * tokens + t - 1];
        if (truth == kNoTarget) continue;
        const float* x = &b.activations.values[(i * tokens + t) * dim];
        for (int64_t d = 0; d < dim; ++d) a[d] = x[d] - wpe->values[t * dim + d];
        // argmin ||a - w_v||^2 = argmax a.w_v - ||w_v||^2 / 2
        int64_t best = 0;
        double best_score = -std::numeric_limits<double>::infinity();
        for (int64_t v = 0; v < vocab; ++v) {
          const float* w = &wte->values[v * dim];
          double dot = 0;
          for (int64_t d = 0; d < dim; ++d) dot += a[d] * w[d];
          if (dot - half_norm[v] > best_score) best_score = dot - half_norm[v], best = v;
        }
        ++out.checked;
        out.recovered += best == truth;
      }
    }
  }
  return out;
}

}  // namespace cleave
