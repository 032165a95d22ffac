// What a curious server keeps of split learning (split.record) and the token attack at a
// decoder's embedding cut, on records made here.
#include "split/attacks.h"

#include <gtest/gtest.h>

#include <random>

#include "data/dataset.h"
#include "split/record.h"

namespace cleave {
namespace {

// A decoder part's embeddings (random, as at initialisation) and `batches` micro-batches
// of two sequences of `tokens` tokens at the embedding cut: activations wte[x] + wpe[t]
// plus N(0, noise^2), and the language model's labels (the next tokens; the last one of
// each sequence unknown).
SplitRecord EmbeddingCutRecord(int batches, int64_t tokens, double noise, uint64_t seed) {
  const int64_t vocab = 50, context = 16, dim = 8;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> init(0, 0.02f), jitter(0, static_cast<float>(noise));
  SplitRecord r;
  Tensor wte{"0.wte.weight", {vocab, dim}, std::vector<float>(vocab * dim)};
  Tensor wpe{"0.wpe.weight", {context, dim}, std::vector<float>(context * dim)};
  for (float& v : wte.values) v = init(rng);
  for (float& v : wpe.values) v = init(rng);
  (void)r.part.Add(wte);
  (void)r.part.Add(wpe);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  for (int k = 0; k < batches; ++k) {
    RecordedBatch b;
    b.activations = Tensor{"", {2, tokens, dim}, std::vector<float>(2 * tokens * dim)};
    for (int64_t i = 0; i < 2; ++i) {
      std::vector<int64_t> x(tokens + 1);
      for (int64_t& t : x) t = token(rng);
      for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t d = 0; d < dim; ++d) {
          b.activations.values[(i * tokens + t) * dim + d] =
              wte.values[x[t] * dim + d] + wpe.values[t * dim + d] + (noise > 0 ? jitter(rng) : 0.0f);
        }
        b.labels.push_back(t + 1 < tokens ? x[t + 1] : kNoTarget);
      }
    }
    b.gradient = Tensor{"", b.activations.shape, std::vector<float>(b.activations.values.size(), 0.5f)};
    r.batches.push_back(std::move(b));
  }
  return r;
}

TEST(SplitRecordTest, EncodesAndDecodesWhatTheServerSaw) {
  const SplitRecord r = EmbeddingCutRecord(3, 6, 0, 1);
  auto back = DecodeSplitRecord(EncodeSplitRecord(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->part.SameLayout(r.part));
  ASSERT_EQ(back->batches.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(back->batches[k].activations.values, r.batches[k].activations.values);
    EXPECT_EQ(back->batches[k].labels, r.batches[k].labels);
    EXPECT_EQ(back->batches[k].gradient.shape, r.batches[k].gradient.shape);
  }
  ParameterSet stray;
  ASSERT_TRUE(stray.Add(Tensor{"weights", {1}, {1.0f}}).ok());
  EXPECT_EQ(DecodeSplitRecord(stray.Encode()).status().code(), absl::StatusCode::kInvalidArgument);
}

// Undefended, every token whose label crossed is recovered; activation noise far above
// the embeddings' scale leaves about chance (1 in 50).
TEST(TokenAttackTest, RecoversEveryTokenAtTheEmbeddingCutUnlessNoiseDrownsThem) {
  auto clean = RecoverTokensAtTheEmbedding(EmbeddingCutRecord(2, 8, 0, 2));
  ASSERT_TRUE(clean.ok()) << clean.status();
  EXPECT_EQ(clean->checked, 2 * 2 * 7) << "positions 1..7 of each sequence: each one's token is the label before";
  EXPECT_EQ(clean->recovered, clean->checked);
  auto noisy = RecoverTokensAtTheEmbedding(EmbeddingCutRecord(20, 8, 1.0, 3));
  ASSERT_TRUE(noisy.ok()) << noisy.status();
  EXPECT_LT(noisy->rate(), 0.15);

  SplitRecord no_labels = EmbeddingCutRecord(1, 4, 0, 4);
  no_labels.batches[0].labels.clear();  // U-shaped: the labels stay on the device
  EXPECT_EQ(RecoverTokensAtTheEmbedding(no_labels).status().code(), absl::StatusCode::kFailedPrecondition);
  SplitRecord deeper = EmbeddingCutRecord(1, 4, 0, 5);
  deeper.part = ParameterSet();  // a part without the embeddings: a later cut's
  EXPECT_EQ(RecoverTokensAtTheEmbedding(deeper).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cleave
