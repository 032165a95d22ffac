#include "split/attacks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
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
    std::vector<int64_t> guessed(batch * tokens, -1);  // the positions ScoreTokens checks
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t t = 1; t < tokens; ++t) {
        if (b.labels[i * tokens + t - 1] == kNoTarget) continue;
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
        guessed[i * tokens + t] = best;
      }
    }
    out.Add(ScoreTokens(guessed, b.labels, tokens));
  }
  return out;
}

TokenRecovery ScoreTokens(const std::vector<int64_t>& guessed, const std::vector<int64_t>& labels, int64_t tokens) {
  TokenRecovery out;
  if (tokens < 1 || guessed.size() != labels.size() || labels.size() % tokens != 0) return out;
  for (size_t i = 0; i < labels.size(); i += tokens) {
    for (int64_t t = 1; t < tokens; ++t) {
      const int64_t truth = labels[i + t - 1];
      if (truth == kNoTarget) continue;
      ++out.checked;
      out.recovered += guessed[i + t] == truth;
    }
  }
  return out;
}

namespace {

// scikit-image's Gaussian window: sigma 1.5 truncated at 3.5 sigma (radius 5), normalised.
std::vector<double> GaussianWindow() {
  std::vector<double> g(11);
  double sum = 0;
  for (int i = 0; i < 11; ++i) sum += g[i] = std::exp(-(i - 5) * (i - 5) / (2 * 1.5 * 1.5));
  for (double& v : g) v /= sum;
  return g;
}

}  // namespace

double Ssim(const float* truth, const float* image, int64_t channels, int64_t h, int64_t w, double range) {
  static const std::vector<double> g = GaussianWindow();
  const double c1 = (0.01 * range) * (0.01 * range), c2 = (0.03 * range) * (0.03 * range);
  const int64_t oh = h - 10, ow = w - 10;
  if (oh < 1 || ow < 1 || channels < 1) return 0;
  double total = 0;
  // Per channel: the five local moments, filtered along rows then columns.
  std::vector<double> rows(5 * h * ow);
  for (int64_t c = 0; c < channels; ++c) {
    const float* x = truth + c * h * w;
    const float* y = image + c * h * w;
    for (int64_t i = 0; i < h; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        double m[5] = {0, 0, 0, 0, 0};
        for (int k = 0; k < 11; ++k) {
          const double a = x[i * w + j + k], b = y[i * w + j + k];
          m[0] += g[k] * a, m[1] += g[k] * b, m[2] += g[k] * a * a, m[3] += g[k] * b * b, m[4] += g[k] * a * b;
        }
        for (int q = 0; q < 5; ++q) rows[(q * h + i) * ow + j] = m[q];
      }
    }
    double sum = 0;
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        double m[5] = {0, 0, 0, 0, 0};
        for (int k = 0; k < 11; ++k) {
          for (int q = 0; q < 5; ++q) m[q] += g[k] * rows[(q * h + i + k) * ow + j];
        }
        const double vx = m[2] - m[0] * m[0], vy = m[3] - m[1] * m[1], cov = m[4] - m[0] * m[1];
        sum += (2 * m[0] * m[1] + c1) * (2 * cov + c2) / ((m[0] * m[0] + m[1] * m[1] + c1) * (vx + vy + c2));
      }
    }
    total += sum / static_cast<double>(oh * ow);
  }
  return total / static_cast<double>(channels);
}

double Psnr(const float* truth, const float* image, int64_t n, double range) {
  double se = 0;
  for (int64_t i = 0; i < n; ++i) se += (static_cast<double>(truth[i]) - image[i]) * (static_cast<double>(truth[i]) - image[i]);
  if (n == 0 || se == 0) return 99;
  return std::min(99.0, 10 * std::log10(range * range / (se / static_cast<double>(n))));
}

std::vector<float> ImagePixels(const std::vector<float>& batch, int64_t i, const std::vector<int64_t>& shape,
                               const Dataset& space) {
  const int64_t c = shape[0], hw = shape[1] * shape[2];
  std::vector<float> px(c * hw);
  for (int64_t ch = 0; ch < c; ++ch) {
    const float mean = ch < static_cast<int64_t>(space.mean.size()) ? space.mean[ch] : 0;
    const float sd = ch < static_cast<int64_t>(space.stddev.size()) ? space.stddev[ch] : 1;
    for (int64_t p = 0; p < hw; ++p) {
      px[ch * hw + p] = std::clamp(batch[(i * c + ch) * hw + p] * sd + mean, 0.0f, 1.0f);
    }
  }
  return px;
}

double MeanSsim(const std::vector<float>& truth, const std::vector<float>& images, int64_t batch,
                const std::vector<int64_t>& shape, const Dataset& space) {
  double sum = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const std::vector<float> a = ImagePixels(truth, i, shape, space), b = ImagePixels(images, i, shape, space);
    sum += Ssim(a.data(), b.data(), shape[0], shape[1], shape[2], 1);
  }
  return batch > 0 ? sum / static_cast<double>(batch) : 0;
}

double RocAuc(const std::vector<double>& scores, const std::vector<bool>& positive) {
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney: the positives' mean rank (ties share theirs) against the negatives.
  double rank_sum = 0;
  int64_t pos = 0;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j < order.size() && scores[order[j]] == scores[order[i]]) ++j;
    const double rank = (static_cast<double>(i) + static_cast<double>(j) + 1) / 2;  // 1-based mean rank of the tie
    for (size_t k = i; k < j; ++k) {
      if (positive[order[k]]) rank_sum += rank, ++pos;
    }
    i = j;
  }
  const int64_t neg = static_cast<int64_t>(scores.size()) - pos;
  if (pos == 0 || neg == 0) return 0.5;
  return (rank_sum - static_cast<double>(pos) * (pos + 1) / 2) / (static_cast<double>(pos) * neg);
}

StatusOr<LabelLeakage> InferLabelsFromGradients(const std::vector<std::vector<float>>& gradients,
                                                const std::vector<int64_t>& labels) {
  if (gradients.size() != labels.size() || gradients.empty()) {
    return absl::InvalidArgumentError("the gradients and their labels do not pair up");
  }
  const size_t dim = gradients[0].size();
  for (const auto& g : gradients) {
    if (g.size() != dim) return absl::InvalidArgumentError("gradients of different sizes");
  }
  // The known example of each class: its first.
  std::map<int64_t, size_t> known;
  for (size_t i = 0; i < labels.size(); ++i) known.emplace(labels[i], i);
  if (known.size() < 2) return absl::InvalidArgumentError("one class only among the labels: nothing to infer");
  std::vector<double> norm(gradients.size());
  for (size_t i = 0; i < gradients.size(); ++i) {
    double s = 0;
    for (float v : gradients[i]) s += static_cast<double>(v) * v;
    norm[i] = std::sqrt(s);
  }
  std::vector<size_t> scored;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (known.at(labels[i]) != i) scored.push_back(i);
  }
  LabelLeakage out;
  out.examples = static_cast<int64_t>(scored.size());
  out.classes = static_cast<int>(known.size());
  if (scored.empty()) return absl::InvalidArgumentError("no example left to score beside the known ones");
  std::vector<bool> is(scored.size());
  if (known.size() == 2) {  // the positive class is the rarer one, as the paper's
    const int64_t first = known.begin()->first, second = known.rbegin()->first;
    const auto count = std::count(labels.begin(), labels.end(), second);
    out.norm_positive = 2 * count <= static_cast<int64_t>(labels.size()) ? second : first;
    std::vector<double> score;
    for (size_t k = 0; k < scored.size(); ++k) {
      score.push_back(norm[scored[k]]), is[k] = labels[scored[k]] == out.norm_positive;
    }
    out.norm_auc = RocAuc(score, is);
  }
  std::map<int64_t, std::vector<double>> cosine;  // by class, over `scored`
  for (const auto& [c, ref] : known) {
    auto& cs = cosine[c];
    for (size_t i : scored) {
      double dot = 0;
      for (size_t d = 0; d < dim; ++d) dot += static_cast<double>(gradients[i][d]) * gradients[ref][d];
      cs.push_back(norm[i] > 0 && norm[ref] > 0 ? dot / (norm[i] * norm[ref]) : 0);
    }
  }
  for (const auto& [c, cs] : cosine) {
    for (size_t k = 0; k < scored.size(); ++k) is[k] = labels[scored[k]] == c;
    out.direction_auc += RocAuc(cs, is) / static_cast<double>(cosine.size());
  }
  int64_t right = 0;
  for (size_t k = 0; k < scored.size(); ++k) {
    int64_t best = -1;
    double best_cos = -2;
    for (const auto& [c, cs] : cosine) {
      if (cs[k] > best_cos) best_cos = cs[k], best = c;
    }
    right += best == labels[scored[k]];
  }
  out.direction_accuracy = static_cast<double>(right) / static_cast<double>(scored.size());
  return out;
}

}  // namespace cleave
