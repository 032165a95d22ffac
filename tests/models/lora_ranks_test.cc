// Per-device LoRA ranks (models/lora_ranks.h): a lower rank's adapters in both layouts
// the models use, and FlexLoRA's aggregation: the factored result reproduces the devices'
// mean product where its rank allows, and each leading block is the best approximation
// of its rank (checked against power iteration, not an SVD).
#include "models/lora_ranks.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace cleave {
namespace {

using Matrix = std::vector<std::vector<double>>;

ModelSpec Spec(const std::string& name, int rank) {
  ModelSpec s;
  s.name = name;
  s.lora.rank = rank;
  s.lora.alpha = 8;
  return s;
}

// The decoder's Conv1D layout: A [in, rank], B [rank, out].
ParameterSet GptAdapters(int64_t in, int64_t out, int64_t rank, std::mt19937& rng) {
  std::normal_distribution<float> n;
  ParameterSet p;
  Tensor a{"0.c.lora_A", {in, rank}, {}}, b{"0.c.lora_B", {rank, out}, {}};
  for (int64_t i = 0; i < in * rank; ++i) a.values.push_back(n(rng));
  for (int64_t i = 0; i < rank * out; ++i) b.values.push_back(n(rng));
  EXPECT_TRUE(p.Add(a).ok());
  EXPECT_TRUE(p.Add(b).ok());
  return p;
}

// left [in, r] x right [r, out], r the first `r` ranks.
Matrix Product(const std::vector<float>& left, const std::vector<float>& right, int64_t in, int64_t out,
               int64_t rank, int64_t r) {
  Matrix m(in, std::vector<double>(out, 0));
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t j = 0; j < out; ++j) {
      for (int64_t k = 0; k < r; ++k) m[i][j] += double{left[i * rank + k]} * right[k * out + j];
    }
  }
  return m;
}

TEST(LoraRanksTest, ALowerRankCutsTheRankDimensionOfEitherLayout) {
  std::mt19937 rng(1);
  auto gpt = AdaptersAtRank(Spec("gpt", 4), GptAdapters(3, 5, 4, rng), 2);
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  EXPECT_EQ(gpt->tensors()[0].shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(gpt->tensors()[1].shape, (std::vector<int64_t>{2, 5}));
  ParameterSet hf;  // PEFT's: A [rank, in], B [out, rank]
  ASSERT_TRUE(hf.Add({"q_proj.lora_A", {4, 3}, std::vector<float>(12, 0)}).ok());
  ASSERT_TRUE(hf.Add({"q_proj.lora_B", {5, 4}, std::vector<float>(20, 0)}).ok());
  auto cut = AdaptersAtRank(Spec("hf", 4), hf, 1);
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_EQ(cut->tensors()[0].shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(cut->tensors()[1].shape, (std::vector<int64_t>{5, 1}));
  EXPECT_FALSE(AdaptersAtRank(Spec("hf", 4), hf, 5).ok()) << "above the federation's rank";
  ParameterSet other;
  ASSERT_TRUE(other.Add({"q_proj.weight", {4, 3}, std::vector<float>(12, 0)}).ok());
  EXPECT_FALSE(AdaptersAtRank(Spec("hf", 4), other, 2).ok()) << "not an adapter";
  EXPECT_DOUBLE_EQ(AlphaAtRank(Spec("hf", 4).lora, 2), 4.0);  // 4 / 2 = 8 / 4
}

TEST(LoraRanksTest, FlexLoraFactorsTheMeanProduct) {
  std::mt19937 rng(7);
  const int64_t in = 6, out = 3, rank = 4;  // the products have rank <= 3 < 4: exact
  const ParameterSet start = GptAdapters(in, out, rank, rng);
  auto sum = FlexLoraSum::Create(Spec("gpt", rank), start);
  ASSERT_TRUE(sum.ok()) << sum.status();
  // Device 1 at rank 2 (weight 1), device 2 at rank 4 (weight 3): random deltas.
  const ParameterSet d1 = GptAdapters(in, out, 2, rng), d2 = GptAdapters(in, out, 4, rng);
  ASSERT_TRUE((*sum)->Add(ViewsOf(d1), 2, 1).ok());
  ASSERT_TRUE((*sum)->Add(ViewsOf(d2), 4, 3).ok());
  EXPECT_FALSE((*sum)->Add(ViewsOf(d1), 4, 1).ok()) << "rank 2's tensors claimed as rank 4";
  // Expected: (1 x A1 B1 + 3 x A2 B2) / 4, each trained = start's block + delta.
  const auto trained = [&](const ParameterSet& d, int64_t r) {
    std::vector<float> a(in * r), b(r * out);
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t k = 0; k < r; ++k) a[i * r + k] = start.tensors()[0].values[i * rank + k] + d.tensors()[0].values[i * r + k];
    }
    for (int64_t k = 0; k < r; ++k) {
      for (int64_t j = 0; j < out; ++j) b[k * out + j] = start.tensors()[1].values[k * out + j] + d.tensors()[1].values[k * out + j];
    }
    return Product(a, b, in, out, r, r);
  };
  const Matrix p1 = trained(d1, 2), p2 = trained(d2, 4);
  auto result = (*sum)->Result();
  ASSERT_TRUE(result.ok()) << result.status();
  const Matrix got = Product(result->tensors()[0].values, result->tensors()[1].values, in, out, rank, rank);
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t j = 0; j < out; ++j) EXPECT_NEAR(got[i][j], (p1[i][j] + 3 * p2[i][j]) / 4, 1e-4);
  }
  // The rank-1 block is the best rank-1 approximation: P v v^T, v P's top right
  // singular vector by power iteration on P^T P.
  Matrix p(in, std::vector<double>(out));
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t j = 0; j < out; ++j) p[i][j] = (p1[i][j] + 3 * p2[i][j]) / 4;
  }
  std::vector<double> v(out, 1.0);
  for (int it = 0; it < 500; ++it) {
    std::vector<double> pv(in, 0), next(out, 0);
    for (int64_t i = 0; i < in; ++i) {
      for (int64_t j = 0; j < out; ++j) pv[i] += p[i][j] * v[j];
    }
    for (int64_t j = 0; j < out; ++j) {
      for (int64_t i = 0; i < in; ++i) next[j] += p[i][j] * pv[i];
    }
    double norm = 0;
    for (double x : next) norm += x * x;
    for (int64_t j = 0; j < out; ++j) v[j] = next[j] / std::sqrt(norm);
  }
  const Matrix one = Product(result->tensors()[0].values, result->tensors()[1].values, in, out, rank, 1);
  for (int64_t i = 0; i < in; ++i) {
    double pv = 0;
    for (int64_t j = 0; j < out; ++j) pv += p[i][j] * v[j];
    for (int64_t j = 0; j < out; ++j) EXPECT_NEAR(one[i][j], pv * v[j], 1e-3);
  }
}

// The same devices in PEFT's layout (A [rank, in], B [out, rank]: every tensor the
// transpose) give the transposed result.
TEST(LoraRanksTest, FlexLoraAgreesAcrossLayouts) {
  std::mt19937 rng(3);
  const int64_t in = 5, out = 4, rank = 2;
  const auto transposed = [](const ParameterSet& gpt) {
    ParameterSet hf;
    for (const Tensor& t : gpt.tensors()) {
      Tensor u{t.name, {t.shape[1], t.shape[0]}, std::vector<float>(t.values.size())};
      for (int64_t i = 0; i < t.shape[0]; ++i) {
        for (int64_t j = 0; j < t.shape[1]; ++j) u.values[j * t.shape[0] + i] = t.values[i * t.shape[1] + j];
      }
      EXPECT_TRUE(hf.Add(u).ok());
    }
    // PEFT's B is [out, rank], the transpose of Conv1D's [rank, out]; A likewise.
    return hf;
  };
  const ParameterSet start = GptAdapters(in, out, rank, rng), d = GptAdapters(in, out, 1, rng);
  auto gpt = FlexLoraSum::Create(Spec("gpt", rank), start);
  auto hf = FlexLoraSum::Create(Spec("hf", rank), transposed(start));
  ASSERT_TRUE(gpt.ok() && hf.ok());
  ASSERT_TRUE((*gpt)->Add(ViewsOf(d), 1, 2).ok());
  ASSERT_TRUE((*hf)->Add(ViewsOf(transposed(d)), 1, 2).ok());
  const ParameterSet a = *(*gpt)->Result(), b = transposed(*(*hf)->Result());
  // Singular vectors are unique up to sign: compare the products.
  const Matrix pa = Product(a.tensors()[0].values, a.tensors()[1].values, in, out, rank, rank);
  const Matrix pb = Product(b.tensors()[0].values, b.tensors()[1].values, in, out, rank, rank);
  for (int64_t i = 0; i < in; ++i) {
    for (int64_t j = 0; j < out; ++j) EXPECT_NEAR(pa[i][j], pb[i][j], 1e-5);
  }
}

}  // namespace
}  // namespace cleave
