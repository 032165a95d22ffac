// Attacks an honest-but-curious server can run on what it recorded of split learning
// (split/record.h), to measure what a cut and a defense leak (docs/security.md).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "data/dataset.h"
#include "split/record.h"

namespace cleave {

// Token recovery from a decoder's activations at its first cut (after the embedding
// stage, split.cut: 1): each position's activation, less the position embedding, is
// matched to the nearest token embedding (Euclidean) of the part the server sent (its
// `wte` and `wpe`). Scored against the labels that crossed with it: a language model's
// label at position t is the token at t + 1, so positions 1.. of each sequence are
// checked (those whose token is a label; kNoTarget ones are not).
struct TokenRecovery {
  int64_t checked = 0;    // positions whose token is known from the labels
  int64_t recovered = 0;  // of them, recovered exactly
  double rate() const { return checked > 0 ? static_cast<double>(recovered) / checked : 0; }
  void Add(const TokenRecovery& o) { checked += o.checked, recovered += o.recovered; }
};
// FAILED_PRECONDITION when the part has no token and position embeddings or the record
// no labels (U-shaped); INVALID_ARGUMENT when the shapes do not fit.
StatusOr<TokenRecovery> RecoverTokensAtTheEmbedding(const SplitRecord& r);
// Guessed tokens ([B * T], each position's) scored as above against a micro-batch's
// language-model labels ([B * T]: position t's token is the label at t - 1).
TokenRecovery ScoreTokens(const std::vector<int64_t>& guessed, const std::vector<int64_t>& labels, int64_t tokens);

// How close a reconstructed image is to the truth, both with values in [0, range]:
// SSIM as Wang et al. 2004 define it (an 11 x 11 Gaussian window of sigma 1.5, K1 =
// 0.01, K2 = 0.03, population variances, over the window positions inside the image,
// the mean over channels; scikit-image's structural_similarity with
// gaussian_weights=True and use_sample_covariance=False), and PSNR (dB; 99 when equal).
// Images are [channels, h, w] with h, w >= 11.
double Ssim(const float* truth, const float* image, int64_t channels, int64_t h, int64_t w, double range);
double Psnr(const float* truth, const float* image, int64_t n, double range);

// Example i of a batch of model inputs [B, C, H, W] (`shape` is [C, H, W]), normalised
// as `space`'s images are (Dataset::mean, stddev per channel), as pixels in [0, 1].
std::vector<float> ImagePixels(const std::vector<float>& batch, int64_t i, const std::vector<int64_t>& shape,
                               const Dataset& space);
// The mean SSIM (range 1) of `images`' examples to `truth`'s, both such batches of
// `batch` examples, as pixels.
double MeanSsim(const std::vector<float>& truth, const std::vector<float>& images, int64_t batch,
                const std::vector<int64_t>& shape, const Dataset& space);

// The area under the ROC curve of `scores` for telling `positive` examples from the
// others (ties count half): 0.5 is chance, 1 a perfect split. 0.5 when one class is empty.
double RocAuc(const std::vector<double>& scores, const std::vector<bool>& positive);

// Label inference from the gradients at the cut (Li et al. 2022, "Label leakage and
// protection in two-party split learning"), scored against the true labels:
// - the norm attack (binary tasks; the positive class is the rarer one, as the
//   paper's): the gradient's norm as the score of being positive;
// - the direction attack: knowing one example's label per class, each other example's
//   score for class c is its gradient's cosine similarity to that example's; the AUC is
//   the mean over classes of class c against the rest, the accuracy that of the most
//   similar class.
struct LabelLeakage {
  int64_t examples = 0;        // scored (the known ones left out)
  int classes = 0;             // seen in the labels
  double norm_auc = -1;        // -1 unless two classes
  int64_t norm_positive = -1;  // its positive class
  double direction_auc = 0;
  double direction_accuracy = 0;
};
// `gradients` one per example (rows of equal length), `labels` theirs. INVALID_ARGUMENT
// when they do not pair up or one class only is seen.
StatusOr<LabelLeakage> InferLabelsFromGradients(const std::vector<std::vector<float>>& gradients,
                                                const std::vector<int64_t>& labels);

}  // namespace cleave
