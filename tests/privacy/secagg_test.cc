// SecAgg+ as a computation: masks cancel exactly, with and without dropouts.
#include "privacy/secagg.h"

#include <gtest/gtest.h>

#include <numeric>

namespace cleave::secagg {
namespace {

struct Federation {
  Params p;
  int n;
  std::vector<std::set<int>> graph;
  std::vector<ClientKeys> keys;
  std::map<int, Bytes> public_keys;
  // shares[u][v]: what u gave neighbour v.
  std::vector<std::map<int, SharesFor>> shares;
  std::vector<std::vector<uint64_t>> inputs;
  std::map<int, std::vector<uint64_t>> masked;  // by Collect
  size_t length;
  Slices slices;  // per-slice masking: each client's positions (empty: the whole vector)

  Federation(int clients, Params params, size_t length, Slices sliced = {})
      : p(std::move(params)), n(clients), length(length), slices(std::move(sliced)) {
    graph = NeighbourGraph(n, p.k, 7);
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal(0, 0.3f);
    for (int u = 0; u < n; ++u) {
      keys.push_back(*NewClientKeys());
      public_keys[u] = keys[u].mask_key.public_key;
      shares.push_back(*ShareSecrets(u, keys[u], graph[u], p));
      std::vector<float> x(slices.empty() ? length : slices.at(u)->size());
      for (auto& v : x) v = normal(rng);
      inputs.push_back(Quantize(x, p, rng));
    }
  }

  // The server's view when `dropped` never send their masked input: survivors return
  // self-seed shares of survivors and mask-key shares of the dropped.
  Unmasking Collect(const std::set<int>& dropped) {
    Unmasking in;
    in.masked_sum.assign(length, 0);
    in.slices = slices;
    for (int u = 0; u < n; ++u) {
      if (dropped.count(u)) continue;
      masked[u] = *Mask(u, inputs[u], keys[u], graph[u], public_keys, p, slices.empty() ? nullptr : &slices);
      in.survivors.insert(u);
      Add(in.masked_sum, u, masked[u]);
    }
    for (int u = 0; u < n; ++u) {
      for (int v : graph[u]) {
        if (dropped.count(v)) continue;  // v holds u's share and is still here
        if (dropped.count(u)) {
          in.mask_key[u].push_back(shares[u][v].mask_key);
        } else {
          in.self_seed[u].push_back(shares[u][v].self_seed);
        }
      }
    }
    return in;
  }

  // Client u's input into the whole vector's sum (at its slice's positions).
  void Add(std::vector<uint64_t>& sum, int u, const std::vector<uint64_t>& y) const {
    if (slices.empty()) {
      AddMod(sum, y, p.modulus);
    } else {
      AddMod(sum, y, *slices.at(u), p.modulus);
    }
  }

  std::vector<uint64_t> PlainSum(const std::set<int>& dropped) const {
    std::vector<uint64_t> s(length, 0);
    for (int u = 0; u < n; ++u) {
      if (!dropped.count(u)) Add(s, u, inputs[u]);
    }
    return s;
  }
};

Params Default() {
  Params p;
  p.k = 6;  // each client tolerates k - t = 3 dropped neighbours
  p.t = 3;
  p.modulus = (uint64_t{1} << 32) - 5;  // not a power of two: the PRG rejection-samples
  p.context = "run r1|round 3";
  return p;
}

TEST(SecAggTest, NeighbourGraphIsSymmetricAndKRegular) {
  const auto g = NeighbourGraph(20, 6, 3);
  for (int u = 0; u < 20; ++u) {
    EXPECT_EQ(g[u].size(), 6u) << u;
    EXPECT_FALSE(g[u].count(u));
    for (int v : g[u]) EXPECT_TRUE(g[v].count(u));
  }
  const auto complete = NeighbourGraph(5, 10, 3);
  for (const auto& s : complete) EXPECT_EQ(s.size(), 4u);
  EXPECT_NE(NeighbourGraph(20, 6, 3), NeighbourGraph(20, 6, 4)) << "the seed picks the graph";
}

TEST(SecAggTest, MasksCancelExactlyWithoutDropouts) {
  Federation f(10, Default(), 1000);
  auto in = f.Collect({});
  for (const auto& [u, y] : f.masked) EXPECT_NE(y, f.inputs[u]) << "masked";
  auto sum = Unmask(in, f.graph, f.public_keys, f.p);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, f.PlainSum({}));
}

TEST(SecAggTest, DropoutsBelowTheThresholdGiveTheSurvivorsSumExactly) {
  Federation f(10, Default(), 1000);
  for (const std::set<int>& dropped : {std::set<int>{3}, std::set<int>{0, 6}}) {
    auto sum = Unmask(f.Collect(dropped), f.graph, f.public_keys, f.p);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, f.PlainSum(dropped));
    EXPECT_NE(*sum, f.PlainSum({}));
  }
}

TEST(SecAggTest, TooManyDropoutsAbortAndSurvivorsKeysStaySecret) {
  Federation f(10, Default(), 100);
  // Drop client 0 and four of its six neighbours: its key has 2 < t shares left.
  std::set<int> dropped = {0};
  auto it = f.graph[0].begin();
  for (int i = 0; i < 4; ++i) dropped.insert(*it++);
  auto sum = Unmask(f.Collect(dropped), f.graph, f.public_keys, f.p);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition) << sum.status();
  // The server never gets both secrets of one client.
  auto in = f.Collect({5});
  const int survivor = *f.graph[5].begin();
  in.mask_key[survivor] = in.self_seed[survivor];
  EXPECT_EQ(Unmask(in, f.graph, f.public_keys, f.p).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Nested windows of a whole vector of `length` (as width-scaled submodels' are): client
// u holds the first length * rate[u] positions of one shuffled order, listed in an order
// of its own.
Slices NestedSlices(const std::vector<double>& rates, size_t length) {
  std::mt19937_64 rng(11);
  Positions order(length);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  Slices out;
  for (int u = 0; u < static_cast<int>(rates.size()); ++u) {
    Positions mine(order.begin(), order.begin() + static_cast<int64_t>(length * rates[u]));
    std::shuffle(mine.begin(), mine.end(), rng);
    out[u] = std::make_shared<const Positions>(std::move(mine));
  }
  return out;
}

TEST(SecAggTest, SharedIndicesListMyIndicesOfCommonPositionsInIncreasingPosition) {
  EXPECT_EQ(SharedIndices({9, 2, 5, 7}, {7, 1, 2, 9}), (std::vector<int64_t>{1, 3, 0}));
  EXPECT_EQ(SharedIndices({7, 1, 2, 9}, {9, 2, 5, 7}), (std::vector<int64_t>{2, 0, 3}));
  EXPECT_TRUE(SharedIndices({1, 2}, {3}).empty());
  EXPECT_EQ(Uncovered({9, 2, 5, 7}, {}), 4);
  const Positions a = {7, 1}, b = {2, 9};
  EXPECT_EQ(Uncovered({9, 2, 5, 7}, {&a, &b}), 1);  // 5
}

TEST(SecAggTest, PerSliceMasksAreSliceLongAndCancelExactlyWithDropouts) {
  std::vector<double> rates;
  for (int u = 0; u < 12; ++u) rates.push_back(std::vector<double>{1, 0.5, 0.25}[u % 3]);
  Federation f(12, Default(), 400, NestedSlices(rates, 400));
  for (const std::set<int>& dropped : {std::set<int>{}, std::set<int>{4}, std::set<int>{0, 5}}) {
    auto in = f.Collect(dropped);
    for (const auto& [u, y] : f.masked) {
      EXPECT_EQ(y.size(), static_cast<size_t>(400 * rates[u])) << u;
      EXPECT_NE(y, f.inputs[u]) << "masked";
    }
    auto sum = Unmask(in, f.graph, f.public_keys, f.p);
    ASSERT_TRUE(sum.ok()) << sum.status();
    EXPECT_EQ(*sum, f.PlainSum(dropped));
  }
  // The server needs every slice the masks used.
  auto in = f.Collect({});
  in.slices.erase(3);
  EXPECT_EQ(Unmask(in, f.graph, f.public_keys, f.p).status().code(), absl::StatusCode::kInvalidArgument);
}

// The shares relayed by the server open only for their addressee, from their sender, in
// their round; any altered byte is refused.
TEST(SecAggTest, SealedSharesOpenOnlyForTheirPairAndRound) {
  Federation f(4, Default(), 10);
  const SharesFor& s = f.shares[0][*f.graph[0].begin()];
  const int to = *f.graph[0].begin();
  const auto& k0 = f.keys[0];
  const auto& kt = f.keys[to];
  auto sealed = SealShares(0, to, s, k0.enc_key.private_key, kt.enc_key.public_key, f.p);
  ASSERT_TRUE(sealed.ok()) << sealed.status();
  auto opened = OpenShares(0, to, *sealed, kt.enc_key.private_key, k0.enc_key.public_key, f.p);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->self_seed.x, s.self_seed.x);
  EXPECT_EQ(opened->self_seed.y, s.self_seed.y);
  EXPECT_EQ(opened->mask_key.y, s.mask_key.y);
  // Tampered.
  for (size_t pos : {size_t{0}, size_t{20}, sealed->size() - 1}) {
    Bytes bad = *sealed;
    bad[pos] ^= 1;
    EXPECT_FALSE(OpenShares(0, to, bad, kt.enc_key.private_key, k0.enc_key.public_key, f.p).ok());
  }
  // Misrouted: claimed as from another sender, or opened by a third client.
  const int other = to == 1 ? 2 : 1;
  EXPECT_FALSE(OpenShares(other, to, *sealed, kt.enc_key.private_key,
                          f.keys[other].enc_key.public_key, f.p).ok());
  EXPECT_FALSE(OpenShares(0, other, *sealed, f.keys[other].enc_key.private_key,
                          k0.enc_key.public_key, f.p).ok());
  // Replayed into another round.
  Params next = f.p;
  next.context = "run r1|round 4";
  EXPECT_FALSE(OpenShares(0, to, *sealed, kt.enc_key.private_key, k0.enc_key.public_key, next).ok());
}

TEST(SecAggTest, QuantizationIsUnbiasedWithinTheClippingRange) {
  Params p = Default();
  p.bits = 8;
  std::mt19937_64 rng(5);
  const std::vector<float> x = {-2.0f, -0.3f, 0.0f, 0.123f, 0.9f, 5.0f};
  std::vector<uint64_t> sum(x.size(), 0);
  const int reps = 2000;
  for (int r = 0; r < reps; ++r) {
    const auto q = Quantize(x, p, rng);
    for (size_t i = 0; i < x.size(); ++i) sum[i] += q[i];
  }
  const auto mean = DequantizeSum(sum, reps, p);
  const double step = 2 * p.clip / 255;
  for (size_t i = 0; i < x.size(); ++i) {
    const double clipped = std::clamp<double>(x[i], -1, 1);
    EXPECT_NEAR(mean[i] / reps, clipped, 5 * step / (2 * std::sqrt(reps))) << i;
  }
}

}  // namespace
}  // namespace cleave::secagg
