#include "compression/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <numeric>
#include <set>

namespace cleave {
namespace {

std::vector<float> Random(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::unique_ptr<Codec> Make(const std::string& spec, uint64_t seed = 1) {
  auto c = MakeCodec(spec, seed);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

std::vector<float> RoundTrip(Codec& c, const std::vector<float>& in, int slot = 0) {
  std::string bytes;
  c.Encode(slot, in.data(), in.size(), &bytes);
  std::vector<float> out(in.size(), -1.0f);
  Status s = c.Decode(bytes, in.size(), out.data());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(CodecTest, HalfAndBfloatConversionsRoundToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);          // largest half
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);          // rounds up to infinity
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -26)), 0x0000);  // below half of it
  EXPECT_EQ(FloatToHalf(0.1f), 0x2e66);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie: to even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie: to even
  EXPECT_FLOAT_EQ(HalfToFloat(0x2e66), 0.0999755859375f);
  EXPECT_FLOAT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);       // tie: to even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_FLOAT_EQ(Bf16ToFloat(0x3f80), 1.0f);
}

TEST(CodecTest, RoundTripsStayWithinTheirBounds) {
  const auto in = Random(10000, 1, 3.0f);
  for (const auto& [spec, relative] :
       std::vector<std::pair<std::string, double>>{{"none", 0}, {"fp16", std::ldexp(1.0, -11)},
                                                   {"bf16", std::ldexp(1.0, -8)}}) {
    auto c = Make(spec);
    const auto out = RoundTrip(*c, in);
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_LE(std::abs(out[i] - in[i]), relative * std::abs(in[i]) + 1e-7) << spec << " " << i;
    }
  }
  float max = 0;
  for (float x : in) max = std::max(max, std::abs(x));
  const float step = max / 127;
  auto nearest = Make("int8");
  auto out = RoundTrip(*nearest, in);
  for (size_t i = 0; i < in.size(); ++i) ASSERT_LE(std::abs(out[i] - in[i]), step / 2 * 1.0001f);
  auto sr = Make("int8:sr");
  out = RoundTrip(*sr, in);
  for (size_t i = 0; i < in.size(); ++i) ASSERT_LT(std::abs(out[i] - in[i]), step * 1.0001f);
}

TEST(CodecTest, StochasticRoundingIsUnbiased) {
  const auto in = Random(64, 2);
  float max = 0;
  for (float x : in) max = std::max(max, std::abs(x));
  const double step = max / 127.0;
  auto c = Make("int8:sr", 7);
  const int reps = 4000;
  std::vector<double> mean(in.size(), 0.0);
  for (int r = 0; r < reps; ++r) {
    const auto out = RoundTrip(*c, in);
    for (size_t i = 0; i < in.size(); ++i) mean[i] += out[i] / reps;
  }
  // Each error lies in (-step, step) with variance <= step^2 / 4: the mean of `reps` is
  // within 5 standard deviations (step / (2 sqrt(reps))) of the input.
  const double bound = 5 * step / (2 * std::sqrt(static_cast<double>(reps)));
  double worst_nearest_bias = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_NEAR(mean[i], in[i], bound) << i;
    worst_nearest_bias = std::max(
        worst_nearest_bias, std::abs(std::nearbyint(in[i] / step) * step - in[i]));
  }
  EXPECT_GT(worst_nearest_bias, bound) << "the test could not tell rounding to nearest apart";
}

TEST(CodecTest, TopKKeepsExactlyTheLargestMagnitudes) {
  auto in = Random(1000, 3);
  auto c = Make("topk:0.01");
  const auto out = RoundTrip(*c, in);
  std::vector<int> order(in.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return std::abs(in[a]) > std::abs(in[b]); });
  const std::set<int> top(order.begin(), order.begin() + 10);
  for (size_t i = 0; i < in.size(); ++i) {
    if (top.count(i)) {
      EXPECT_EQ(out[i], in[i]) << i;
    } else {
      EXPECT_EQ(out[i], 0.0f) << i;
    }
  }
  std::string bytes;
  Make("topk:0.01")->Encode(0, in.data(), in.size(), &bytes);
  EXPECT_EQ(bytes.size(), 4u + 10 * 8);
}

TEST(CodecTest, ErrorFeedbackConservesMass) {
  auto c = Make("topk:0.05");
  const int64_t n = 400;
  std::vector<double> inputs(n, 0.0), sent(n, 0.0);
  for (int call = 0; call < 5; ++call) {
    const auto in = Random(n, 10 + call);
    for (int64_t i = 0; i < n; ++i) inputs[i] += in[i];
    const auto out = RoundTrip(*c, in, /*slot=*/3);
    for (int64_t i = 0; i < n; ++i) sent[i] += out[i];
  }
  const auto residual = c->Residual(3);
  ASSERT_EQ(residual.size(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(sent[i] + residual[i], inputs[i], 1e-5) << i;
  EXPECT_TRUE(c->Residual(4).empty()) << "slots are separate";
}

// A malformed encoding is refused with a clear status and leaves `out` as it was.
TEST(CodecTest, MalformedEncodingsAreRejected) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto expect_bad = [](const std::string& spec, const std::string& bytes, int64_t n,
                       const std::string& needle) {
    auto c = Make(spec);
    std::vector<float> out(n, 42.0f);
    Status s = c->Decode(bytes, n, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << spec << ": " << s;
    EXPECT_NE(s.message().find(needle), std::string::npos) << spec << ": " << s;
    for (float v : out) ASSERT_EQ(v, 42.0f) << spec << ": output touched";
  };
  auto encode = [](const std::string& spec, const std::vector<float>& v) {
    std::string b;
    Make(spec)->Encode(0, v.data(), v.size(), &b);
    return b;
  };
  const std::vector<float> v = {1, -2, 3, -4};
  for (const char* spec : {"none", "fp16", "bf16", "int8", "topk:0.5"}) {
    std::string b = encode(spec, v);
    expect_bad(spec, b.substr(0, b.size() - 1), 4, "expected");
    expect_bad(spec, b + "x", 4, "expected");
  }
  std::string b = encode("none", v);
  std::memcpy(&b[4], &nan, 4);
  expect_bad("none", b, 4, "not all finite");
  b = encode("int8", v);
  std::memcpy(&b[0], &nan, 4);
  expect_bad("int8", b, 4, "scale");
  b = encode("int8", v);
  b[5] = static_cast<char>(-128);
  expect_bad("int8", b, 4, "-128");
  // topk: [k=2][idx 1][idx 3][v][v]
  b = encode("topk:0.5", v);
  std::string bad = b;
  const uint32_t out_of_range = 4;
  std::memcpy(&bad[8], &out_of_range, 4);
  expect_bad("topk:0.5", bad, 4, "out of range");
  bad = b;
  std::memcpy(&bad[8], &b[4], 4);  // the same index twice
  expect_bad("topk:0.5", bad, 4, "not increasing");
  bad = b;
  const uint32_t too_many = 5;
  std::memcpy(&bad[0], &too_many, 4);
  expect_bad("topk:0.5", bad, 4, "5 of 4");
  bad = b;
  std::memcpy(&bad[12], &nan, 4);
  expect_bad("topk:0.5", bad, 4, "not finite");
  expect_bad("topk:0.5", "", 4, "count");
}

TEST(CodecTest, UnknownSpecsAreRefused) {
  EXPECT_EQ(MakeCodec("zip").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCodec("topk:0").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCodec("topk:1.5").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCodec("topk:x").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Make("fp32")->name(), "none");
}

}  // namespace
}  // namespace cleave
