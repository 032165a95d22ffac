// What a curious server keeps of split learning (split.record) and the token attack at a
// decoder's embedding cut, on records made here.
#include "split/attacks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

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
  r.cut = 1;
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
  EXPECT_EQ(back->cut, 1);
  EXPECT_EQ(back->update.size(), 0u);
  SplitRecord update;  // a federated round's: the model and the update, no micro-batch
  update.part = r.part;
  ASSERT_TRUE(update.update.Add(Tensor{"0.wte.weight", r.part.tensors()[0].shape, r.part.tensors()[0].values}).ok());
  auto updated = DecodeSplitRecord(EncodeSplitRecord(update));
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_TRUE(updated->part.SameLayout(r.part));
  ASSERT_EQ(updated->update.size(), 1u);
  EXPECT_EQ(updated->update.tensors()[0].values, r.part.tensors()[0].values);
  EXPECT_TRUE(updated->batches.empty());
  ASSERT_EQ(back->batches.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(back->batches[k].activations.values, r.batches[k].activations.values);
    EXPECT_EQ(back->batches[k].labels, r.batches[k].labels);
    EXPECT_EQ(back->batches[k].gradient.shape, r.batches[k].gradient.shape);
  }
  ParameterSet stray;
  ASSERT_TRUE(stray.Add(Tensor{"weights", {1}, {1.0f}}).ok());
  EXPECT_EQ(DecodeSplitRecord(stray.Encode()).status().code(), absl::StatusCode::kInvalidArgument);
  // A record is a file anyone may have altered: labels that are no class, values that are
  // no number, and names that are not text are refused, not scored ("SSIM nan").
  for (float label : {std::nanf(""), 1e30f, -3.0f, 2.5f}) {
    ParameterSet set = ParameterSet::Decode(EncodeSplitRecord(r)).value();
    for (Tensor& t : set.mutable_tensors()) {
      if (t.name == "labels/0") t.values[0] = label;
    }
    auto bad = DecodeSplitRecord(set.Encode());
    ASSERT_FALSE(bad.ok()) << label;
    EXPECT_NE(bad.status().message().find("labels/0 holds"), std::string::npos) << bad.status();
  }
  ParameterSet nan = ParameterSet::Decode(EncodeSplitRecord(r)).value();
  nan.mutable_tensors().back().values[0] = std::nanf("");
  EXPECT_EQ(DecodeSplitRecord(nan.Encode()).status().code(), absl::StatusCode::kInvalidArgument);
  ParameterSet binary;
  ASSERT_TRUE(binary.Add(Tensor{std::string("act/\x01\xff\x00x", 7), {1}, {1.0f}}).ok());
  auto raw = DecodeSplitRecord(binary.Encode());
  ASSERT_FALSE(raw.ok());
  EXPECT_EQ(raw.status().message().find('\xff'), std::string::npos) << "raw bytes in: " << raw.status();
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

// Writes `bytes` to a fresh file in the test's temporary folder, runs the reference
// script's `what` on it and returns what it wrote, `count` doubles.
std::vector<double> Reference(const std::string& what, const std::string& bytes, size_t count) {
  // Tests run in parallel processes: a name of this one's own.
  const std::string dir = ::testing::TempDir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string in = dir + "_in.bin", out = dir + "_out.bin";
  std::FILE* f = std::fopen(in.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  const std::string cmd = std::string("/usr/bin/python3 ") + CLEAVE_SOURCE_DIR + "/tests/split/similarity_reference.py " +
                          what + " " + in + " " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<double> r(count);
  f = std::fopen(out.c_str(), "rb");
  EXPECT_NE(f, nullptr);
  if (f != nullptr) {
    EXPECT_EQ(std::fread(r.data(), 8, count, f), count);
    std::fclose(f);
  }
  return r;
}

template <typename T>
void Append(std::string* s, const T& v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}

// SSIM and PSNR equal scikit-image's (an independent implementation of Wang et al.
// 2004) on grey and RGB images, from near copies to unrelated ones.
TEST(ImageSimilarityTest, MatchesScikitImage) {
  for (const int32_t c : {1, 3}) {
    SCOPED_TRACE(c);
    const int32_t n = 4, h = 28, w = 23;
    const int64_t e = c * h * w;
    std::mt19937_64 rng(c);
    std::uniform_real_distribution<float> u(0, 1);
    std::normal_distribution<float> jitter(0, 1);
    std::vector<float> truth(n * e), other(n * e);
    for (int64_t i = 0; i < n * e; ++i) truth[i] = u(rng) * u(rng);
    const float spread[n] = {0.01f, 0.1f, 0.4f, -1};  // -1: an unrelated image
    for (int32_t k = 0; k < n; ++k) {
      for (int64_t i = 0; i < e; ++i) {
        const float v = spread[k] < 0 ? u(rng) : truth[k * e + i] + spread[k] * jitter(rng);
        other[k * e + i] = std::clamp(v, 0.0f, 1.0f);
      }
    }
    std::string bytes;
    for (int32_t d : {n, c, h, w}) Append(&bytes, d);
    bytes.append(reinterpret_cast<const char*>(truth.data()), 4 * truth.size());
    bytes.append(reinterpret_cast<const char*>(other.data()), 4 * other.size());
    const std::vector<double> ref = Reference("ssim", bytes, 2 * n);
    for (int32_t k = 0; k < n; ++k) {
      EXPECT_NEAR(Ssim(&truth[k * e], &other[k * e], c, h, w, 1), ref[2 * k], 1e-6) << k;
      EXPECT_NEAR(Psnr(&truth[k * e], &other[k * e], e, 1), ref[2 * k + 1], 1e-6) << k;
    }
    EXPECT_NEAR(Ssim(truth.data(), truth.data(), c, h, w, 1), 1, 1e-12);
    EXPECT_EQ(Psnr(truth.data(), truth.data(), e, 1), 99);
  }
}

// The AUC equals scikit-learn's roc_auc_score, ties included.
TEST(ImageSimilarityTest, RocAucMatchesScikitLearn) {
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> tie(0, 6);
  std::bernoulli_distribution coin(0.3);
  const int32_t n = 200;
  std::vector<double> scores(n);
  std::vector<bool> positive(n);
  std::string bytes;
  Append(&bytes, n);
  for (int32_t i = 0; i < n; ++i) {
    positive[i] = coin(rng);
    scores[i] = tie(rng) + (positive[i] ? 1.5 : 0);  // few distinct values: many ties
  }
  for (double v : scores) Append(&bytes, v);
  for (bool p : positive) Append(&bytes, static_cast<int32_t>(p));
  EXPECT_NEAR(RocAuc(scores, positive), Reference("auc", bytes, 1)[0], 1e-12);
  EXPECT_EQ(RocAuc({1, 2, 3}, {true, true, true}), 0.5) << "one class only";
}

// Gradients of a softmax layer's input, W^T (p - onehot(y)), give their labels away by
// direction; with a rare positive class of a binary task, by norm too (Li et al.).
// Gradients that carry no label are near chance.
TEST(LabelAttackTest, InfersLabelsFromTheGradientsAtTheCut) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0, 1);
  std::uniform_real_distribution<float> u(0, 1);
  const int classes = 5, dim = 16;
  std::vector<float> w(classes * dim);
  for (float& v : w) v = normal(rng);
  auto gradient = [&](int64_t y, int k) {
    std::vector<float> p(k), g(dim, 0);
    float sum = 0;
    for (float& v : p) sum += v = std::exp(normal(rng) * 0.3f);
    for (int c = 0; c < k; ++c) {
      const float d = p[c] / sum - (c == y ? 1.0f : 0.0f);
      for (int i = 0; i < dim; ++i) g[i] += w[c * dim + i] * d;
    }
    return g;
  };
  std::vector<std::vector<float>> grads;
  std::vector<int64_t> labels;
  for (int i = 0; i < 300; ++i) labels.push_back(i % classes), grads.push_back(gradient(i % classes, classes));
  auto r = InferLabelsFromGradients(grads, labels);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->examples, 300 - classes) << "one known example per class is not scored";
  EXPECT_EQ(r->classes, classes);
  EXPECT_GT(r->direction_accuracy, 0.95);
  EXPECT_GT(r->direction_auc, 0.95);
  EXPECT_EQ(r->norm_auc, -1) << "the norm attack is the binary one";

  // Binary, positives (class 0) one in ten, an untrained model (p near the prior for
  // both): the positives' gradients are the larger.
  grads.clear(), labels.clear();
  for (int i = 0; i < 300; ++i) {
    const int64_t y = i % 10 == 0 ? 0 : 1;
    const float p0 = 0.1f + 0.05f * u(rng);  // the model's probability of class 0
    std::vector<float> g(dim);
    for (int d = 0; d < dim; ++d) g[d] = (w[d] - w[dim + d]) * (p0 - (y == 0 ? 1.0f : 0.0f));
    grads.push_back(g), labels.push_back(y);
  }
  r = InferLabelsFromGradients(grads, labels);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->norm_positive, 0);
  EXPECT_GT(r->norm_auc, 0.99);

  grads.clear(), labels.clear();
  for (int i = 0; i < 400; ++i) {
    std::vector<float> g(dim);
    for (float& v : g) v = normal(rng);
    grads.push_back(g), labels.push_back(i % 2);
  }
  r = InferLabelsFromGradients(grads, labels);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->direction_auc, 0.5, 0.1);
  EXPECT_NEAR(r->norm_auc, 0.5, 0.1);

  EXPECT_EQ(InferLabelsFromGradients(grads, {1, 2}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InferLabelsFromGradients({{1}, {2}}, {3, 3}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(InferLabelsFromGradients({{1}, {2, 3}}, {0, 1}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave
