// Attacks an honest-but-curious server can run on what it recorded of split learning
// (split/record.h), to measure what a cut and a defense leak (docs/security.md).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
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
};
// FAILED_PRECONDITION when the part has no token and position embeddings or the record
// no labels (U-shaped); INVALID_ARGUMENT when the shapes do not fit.
StatusOr<TokenRecovery> RecoverTokensAtTheEmbedding(const SplitRecord& r);

}  // namespace cleave
