#include "compression/codec.h"
#include "compression/quantized_set.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"

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

Shape Flat(const std::vector<float>& v) { return {static_cast<int64_t>(v.size())}; }

std::string Encode(Codec& c, const std::vector<float>& in, const Shape& shape, int slot = 0) {
  std::string bytes;
  c.Encode(slot, in.data(), shape, &bytes);
  EXPECT_EQ(static_cast<int64_t>(bytes.size()), c.EncodedSize(shape)) << c.name();
  return bytes;
}

std::vector<float> RoundTrip(Codec& c, const std::vector<float>& in, const Shape& shape,
                             int slot = 0) {
  const std::string bytes = Encode(c, in, shape, slot);
  std::vector<float> out(in.size(), -1.0f);
  Status s = c.Decode(bytes, shape, out.data());
  EXPECT_TRUE(s.ok()) << c.name() << ": " << s;
  return out;
}

std::vector<float> RoundTrip(Codec& c, const std::vector<float>& in, int slot = 0) {
  return RoundTrip(c, in, Flat(in), slot);
}

float MaxAbs(const float* v, int64_t n) {
  float max = 0;
  for (int64_t i = 0; i < n; ++i) max = std::max(max, std::abs(v[i]));
  return max;
}

// Every codec, with its parameters.
const std::vector<std::string> kAllSpecs = {
    "none", "fp16", "bf16", "int8", "int8:sr", "int8:channel", "int8:channel:sr", "int8:token",
    "int8:token:sr", "qsgd:1", "qsgd:4", "qsgd:127", "topk:0.1", "topk:0.1:noef", "randk:0.1", "sign", "powersgd:1", "powersgd:3",
    "nf4", "nf4:dq"};

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
  const float step = MaxAbs(in.data(), in.size()) / 127;
  auto nearest = Make("int8");
  auto out = RoundTrip(*nearest, in);
  for (size_t i = 0; i < in.size(); ++i) ASSERT_LE(std::abs(out[i] - in[i]), step / 2 * 1.0001f);
  auto sr = Make("int8:sr");
  out = RoundTrip(*sr, in);
  for (size_t i = 0; i < in.size(); ++i) ASSERT_LT(std::abs(out[i] - in[i]), step * 1.0001f);
}

TEST(CodecTest, PerChannelInt8ScalesEachRowByItsOwnMaximum) {
  // 4 rows of 250 whose magnitudes differ by 1000x: each row's error is bounded by half
  // of its own step, far below what one scale for the tensor allows.
  const Shape shape = {4, 5, 50};
  std::vector<float> in = Random(1000, 4);
  for (int64_t i = 0; i < 1000; ++i) in[i] *= std::pow(10.0f, static_cast<float>(i / 250) - 2);
  auto c = Make("int8:channel");
  EXPECT_EQ(c->EncodedSize(shape), 4 * 4 + 1000);
  const auto out = RoundTrip(*c, in, shape);
  for (int64_t row = 0; row < 4; ++row) {
    const float step = MaxAbs(in.data() + 250 * row, 250) / 127;
    for (int64_t i = 250 * row; i < 250 * (row + 1); ++i) {
      ASSERT_LE(std::abs(out[i] - in[i]), step / 2 * 1.0001f) << i;
    }
  }
  EXPECT_GT(std::abs(RoundTrip(*Make("int8"), in, shape)[3] - in[3]), 10 * std::abs(out[3] - in[3]) + 1e-6)
      << "one scale for the tensor should lose the small row";
  auto bias = Make("int8:channel");  // a 1-D tensor has one scale
  EXPECT_EQ(bias->EncodedSize({10}), 4 + 10);
}

TEST(CodecTest, PerTokenInt8ScalesEachLastDimensionVectorByItsOwnMaximum) {
  // Activations [2 sequences, 3 tokens, 40 dims] whose tokens' magnitudes span 1e-3..1e2:
  // each token's error is within half of its own step, whose bfloat16 scale is rounded
  // up (at most 2^-7 above max / 127) so that no value is clipped.
  const Shape shape = {2, 3, 40};
  std::vector<float> in = Random(240, 6);
  for (int64_t i = 0; i < 240; ++i) in[i] *= std::pow(10.0f, static_cast<float>(i / 40) - 3);
  auto c = Make("int8:token");
  EXPECT_EQ(c->EncodedSize(shape), 2 * 6 + 240);
  std::string bytes;
  c->Encode(0, in.data(), shape, &bytes);
  const auto out = RoundTrip(*c, in, shape);
  for (int64_t t = 0; t < 6; ++t) {
    const float exact = MaxAbs(in.data() + 40 * t, 40) / 127;
    uint16_t b;
    std::memcpy(&b, bytes.data() + 2 * t, 2);
    const float scale = Bf16ToFloat(b);
    ASSERT_GE(scale, exact) << t;
    ASSERT_LE(scale, exact * (1 + std::ldexp(1.0f, -7))) << t;
    for (int64_t i = 40 * t; i < 40 * (t + 1); ++i) {
      ASSERT_LE(std::abs(out[i] - in[i]), scale / 2 * 1.0001f) << i;
    }
  }
  // Per sequence (int8:channel) loses the small tokens of each sequence.
  EXPECT_GT(std::abs(RoundTrip(*Make("int8:channel"), in, shape)[5] - in[5]),
            10 * std::abs(out[5] - in[5]) + 1e-7);
  EXPECT_EQ(c->EncodedSize({10}), 2 + 10);  // a 1-D tensor has one scale
  EXPECT_EQ(c->EncodedSize({4, 0}), 2);     // no values: one (zero) scale
  // A NaN or negative scale is refused.
  for (uint16_t bad : {uint16_t{0x7fc0}, uint16_t{0xbf80}, uint16_t{0x7f80}}) {
    std::string b2 = bytes;
    std::memcpy(b2.data() + 2, &bad, 2);
    EXPECT_EQ(c->Check(b2, shape).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(CodecTest, QsgdErrorIsBelowOneLevelOfItsBucketNorm) {
  const auto in = Random(1300, 5);  // buckets of 512, 512, 276
  for (int s : {1, 4, 127}) {
    auto c = Make(absl::StrCat("qsgd:", s));
    const int bits = s == 1 ? 2 : s == 4 ? 4 : 8;
    EXPECT_EQ(c->EncodedSize(Flat(in)), 3 * 4 + (1300 * bits + 7) / 8) << s;
    const auto out = RoundTrip(*c, in);
    for (int64_t b = 0; b < 3; ++b) {
      double sq = 0;
      for (int64_t i = 512 * b; i < std::min<int64_t>(1300, 512 * (b + 1)); ++i) sq += in[i] * in[i];
      const double level = std::sqrt(sq) / s;
      for (int64_t i = 512 * b; i < std::min<int64_t>(1300, 512 * (b + 1)); ++i) {
        ASSERT_LT(std::abs(out[i] - in[i]), level * 1.0001) << s << " " << i;
        ASSERT_TRUE(out[i] == 0 || (out[i] > 0) == (in[i] > 0)) << "sign kept " << i;
      }
    }
  }
}

// Each error lies in (-step, step), so has variance <= step^2 / 4: the mean of `reps`
// round trips is within 5 standard deviations (step / (2 sqrt(reps))) of the input.
void ExpectUnbiased(const std::string& spec, const std::vector<float>& in, const Shape& shape,
                    const std::vector<double>& step) {
  auto c = Make(spec, 7);
  const int reps = 4000;
  std::vector<double> mean(in.size(), 0.0);
  for (int r = 0; r < reps; ++r) {
    const auto out = RoundTrip(*c, in, shape);
    for (size_t i = 0; i < in.size(); ++i) mean[i] += out[i] / reps;
  }
  double worst_nearest_bias = 0;  // how far a deterministic rounding would be off
  for (size_t i = 0; i < in.size(); ++i) {
    const double bound = 5 * step[i] / (2 * std::sqrt(static_cast<double>(reps)));
    ASSERT_NEAR(mean[i], in[i], bound) << spec << " " << i;
    worst_nearest_bias = std::max(
        worst_nearest_bias, std::abs(std::nearbyint(in[i] / step[i]) * step[i] - in[i]) / bound);
  }
  EXPECT_GT(worst_nearest_bias, 1) << spec << ": the test could not tell rounding to nearest apart";
}

TEST(CodecTest, StochasticRoundingIsUnbiased) {
  const auto in = Random(64, 2);
  ExpectUnbiased("int8:sr", in, Flat(in), std::vector<double>(64, MaxAbs(in.data(), 64) / 127.0));
  std::vector<double> row_steps(64);
  for (int i = 0; i < 64; ++i) row_steps[i] = MaxAbs(in.data() + 16 * (i / 16), 16) / 127.0;
  ExpectUnbiased("int8:channel:sr", in, {4, 16}, row_steps);
  // Per token of [2, 4, 8]: groups of 8, scales rounded up to bfloat16.
  std::vector<double> token_steps(64);
  for (int i = 0; i < 64; ++i) {
    const float exact = MaxAbs(in.data() + 8 * (i / 8), 8) / 127.0f;
    const float nearest = Bf16ToFloat(FloatToBf16(exact));
    token_steps[i] = nearest >= exact ? nearest : Bf16ToFloat(FloatToBf16(exact) + 1);
  }
  ExpectUnbiased("int8:token:sr", in, {2, 4, 8}, token_steps);
  double sq = 0;
  for (float x : in) sq += x * x;
  ExpectUnbiased("qsgd:4", in, Flat(in), std::vector<double>(64, std::sqrt(sq) / 4));
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
  EXPECT_EQ(c->EncodedSize(Flat(in)), 4 + 10 * 8);
}

// Without error feedback each call sends the top k of its own input, exactly, and keeps
// nothing: the same input twice encodes the same bytes.
TEST(CodecTest, TopKWithoutFeedbackSendsEachInputsTopAlone) {
  auto c = Make("topk:0.01:noef");
  EXPECT_FALSE(c->stateful());
  const auto in = Random(1000, 3);
  const auto reference = Make("topk:0.01");  // its first call has nothing owed yet
  EXPECT_EQ(RoundTrip(*c, in, 1), RoundTrip(*reference, in, 1));
  std::string first, second;
  c->Encode(1, in.data(), Flat(in), &first);
  c->Encode(1, in.data(), Flat(in), &second);
  EXPECT_EQ(first, second);
  EXPECT_TRUE(c->Residual(1).empty());
}

// EF21: the codec keeps h, the sum of all it sent, and sends the top k of in - h.
TEST(CodecTest, TopKEf21SendsTheTopOfWhatItsEstimateMisses) {
  auto c = Make("topk:0.05:ef21");
  const int64_t n = 400, k = 20;
  std::vector<float> h(n, 0.0f);
  for (int call = 0; call < 4; ++call) {
    const auto in = Random(n, 20 + call);
    std::vector<float> miss(n);
    for (int64_t i = 0; i < n; ++i) miss[i] = -h[i] + in[i];
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return std::abs(miss[a]) > std::abs(miss[b]); });
    const std::set<int> top(order.begin(), order.begin() + k);
    const auto out = RoundTrip(*c, in, /*slot=*/2);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], top.count(i) ? miss[i] : 0.0f) << "call " << call << " index " << i;
      h[i] += out[i];
    }
    EXPECT_EQ(c->Residual(2), h) << "the codec's estimate is the sum of what it sent";
  }
}

TEST(CodecTest, RandKSendsOneValueFromEachStride) {
  const auto in = Random(1003, 6);  // k = 101 strides of 9 or 10 values
  auto c = Make("randk:0.1", 11);
  EXPECT_EQ(c->EncodedSize(Flat(in)), 8 + 4 * 101);
  std::set<int64_t> first;
  for (int call = 0; call < 2; ++call) {
    auto fresh = Make("randk:0.1", 11 + call);  // no residual: what is sent is the input
    const auto out = RoundTrip(*fresh, in);
    int64_t sent = 0;
    for (int64_t j = 0; j < 101; ++j) {
      int in_stride = 0;
      for (int64_t i = j * 1003 / 101; i < (j + 1) * 1003 / 101; ++i) {
        if (out[i] != 0) {
          ++in_stride;
          EXPECT_EQ(out[i], in[i]);
          if (call == 0) {
            first.insert(i);
          } else {
            sent += first.count(i);
          }
        }
      }
      ASSERT_EQ(in_stride, 1) << "stride " << j;
    }
    if (call == 1) {
      EXPECT_LT(sent, 50) << "another seed picks other positions";
    }
  }
}

TEST(CodecTest, PowerSgdRecoversALowRankMatrixAndSendsSmallTensorsWhole) {
  // M = A B^T with rank 3: one power iteration spans A's columns, so P Q^T = M.
  const int64_t rows = 40, cols = 30;
  const auto a = Random(rows * 3, 8), b = Random(cols * 3, 9);
  std::vector<float> m(rows * cols, 0.0f);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      for (int c = 0; c < 3; ++c) m[i * cols + j] += a[i * 3 + c] * b[j * 3 + c];
    }
  }
  auto c = Make("powersgd:3");
  const Shape shape = {rows, 5, 6};
  EXPECT_EQ(c->EncodedSize(shape), 4 * 3 * (rows + cols));
  const auto out = RoundTrip(*c, m, shape);
  for (int64_t i = 0; i < rows * cols; ++i) ASSERT_NEAR(out[i], m[i], 1e-4 * (1 + std::abs(m[i]))) << i;
  auto rank1 = Make("powersgd:1");
  const auto approx = RoundTrip(*rank1, m, shape);
  double err = 0;
  for (int64_t i = 0; i < rows * cols; ++i) err += std::abs(approx[i] - m[i]);
  EXPECT_GT(err, 1.0) << "rank 1 cannot carry a rank-3 matrix in one call";
  // 1-D and small tensors travel as float32, exactly.
  const auto bias = Random(50, 10);
  EXPECT_EQ(c->EncodedSize({50}), 200);
  EXPECT_EQ(RoundTrip(*c, bias, {50}), bias);
  EXPECT_EQ(c->EncodedSize({4, 4}), 64);
}

TEST(CodecTest, ErrorFeedbackConservesMass) {
  for (const std::string spec : {"topk:0.05", "randk:0.05", "sign", "powersgd:2"}) {
    auto c = Make(spec);
    const Shape shape = {20, 20};
    const int64_t n = 400;
    std::vector<double> inputs(n, 0.0), sent(n, 0.0);
    for (int call = 0; call < 5; ++call) {
      const auto in = Random(n, 10 + call);
      for (int64_t i = 0; i < n; ++i) inputs[i] += in[i];
      const auto out = RoundTrip(*c, in, shape, /*slot=*/3);
      for (int64_t i = 0; i < n; ++i) sent[i] += out[i];
    }
    const auto residual = c->Residual(3);
    ASSERT_EQ(residual.size(), static_cast<size_t>(n)) << spec;
    double owed = 0;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(sent[i] + residual[i], inputs[i], 1e-4) << spec << " " << i;
      owed += std::abs(residual[i]);
    }
    EXPECT_GT(owed, 0) << spec << " compresses, so something stays owed";
    EXPECT_TRUE(c->Residual(4).empty()) << "slots are separate";
  }
}

TEST(CodecTest, RangesDecodeLikeTheWhole) {
  const Shape shape = {37, 3, 11};  // 1221 values
  const auto in = Random(1221, 12);
  for (const auto& spec : kAllSpecs) {
    auto c = Make(spec);
    const std::string bytes = Encode(*c, in, shape);
    std::vector<float> whole(1221);
    ASSERT_TRUE(c->Decode(bytes, shape, whole.data()).ok()) << spec;
    std::mt19937 rng(1);
    for (int trial = 0; trial < 20; ++trial) {
      const int64_t begin = rng() % 1221, count = rng() % (1222 - begin);
      std::vector<float> part(count);
      c->DecodeRange(bytes, shape, begin, count, part.data());
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(part[i], whole[begin + i]) << spec << " " << begin + i;
    }
  }
}

// A malformed encoding is refused with a clear status and leaves `out` as it was.
TEST(CodecTest, MalformedEncodingsAreRejected) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Shape shape = {4};
  auto expect_bad = [&](const std::string& spec, const std::string& bytes, const std::string& needle) {
    auto c = Make(spec);
    std::vector<float> out(4, 42.0f);
    Status s = c->Decode(bytes, shape, out.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << spec << ": " << s;
    EXPECT_NE(s.message().find(needle), std::string::npos) << spec << ": " << s;
    for (float v : out) ASSERT_EQ(v, 42.0f) << spec << ": output touched";
  };
  const std::vector<float> v = {1, -2, 3, -4};
  auto encode = [&](const std::string& spec) { return Encode(*Make(spec), v, shape); };
  for (const auto& spec : kAllSpecs) {
    if (spec == "topk:0.1") continue;  // a count comes first: below
    std::string b = encode(spec);
    expect_bad(spec, b.substr(0, b.size() - 1), "expected");
    expect_bad(spec, b + "x", "expected");
  }
  std::string b = encode("none");
  std::memcpy(&b[4], &nan, 4);
  expect_bad("none", b, "not finite");
  for (const char* spec : {"fp16", "bf16"}) {
    b = encode(spec);
    b[3] = static_cast<char>(0x7f);  // value 1: exponent all ones
    b[2] = static_cast<char>(0xff);
    expect_bad(spec, b, "not finite");
  }
  for (const char* spec : {"int8", "int8:channel", "sign", "qsgd:4", "nf4", "nf4:dq"}) {
    b = encode(spec);
    std::memcpy(&b[0], &nan, 4);
    expect_bad(spec, b, "not a finite number");
  }
  b = encode("int8");
  const float huge = 1e38f;  // finite, but 127 steps of it are not
  std::memcpy(&b[0], &huge, 4);
  expect_bad("int8", b, "scale");
  b = encode("int8");
  b[5] = static_cast<char>(-128);
  expect_bad("int8", b, "-128");
  // qsgd:4, 4 bits a value: a field of 9 is level 5 > 4; unused bits must be zero.
  b = encode("qsgd:4");
  b[4] = static_cast<char>(0x09 | (b[4] & 0xf0));
  expect_bad("qsgd:4", b, "level beyond 4");
  // Bit-packed codecs with unused bits in the last byte (3 values: qsgd:1 uses 6 of 8
  // bits, sign 3 of 8): those bits must be zero.
  for (const char* spec : {"qsgd:1", "sign", "nf4"}) {
    auto c = Make(spec);
    std::string three;
    c->Encode(0, v.data(), {3}, &three);
    three.back() = static_cast<char>(three.back() | 0x80);
    std::vector<float> out(3);
    EXPECT_NE(c->Decode(three, {3}, out.data()).message().find("padding"), std::string_view::npos)
        << spec;
  }
  b = encode("randk:0.1");  // [seed u64][one value]
  std::memcpy(&b[8], &nan, 4);
  expect_bad("randk:0.1", b, "not finite");
  {
    auto c = Make("powersgd:1");
    const std::vector<float> m = Random(100, 13);
    std::string pq = Encode(*c, m, {10, 10});
    std::memcpy(&pq[8], &nan, 4);
    std::vector<float> out(100, 42.0f);
    EXPECT_EQ(c->Decode(pq, {10, 10}, out.data()).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(out[0], 42.0f);
    // Finite factors whose product overflows.
    std::string big(4 * 20, '\0');
    const float f = 1e30f;
    for (int i = 0; i < 20; ++i) std::memcpy(&big[4 * i], &f, 4);
    EXPECT_NE(c->Decode(big, {10, 10}, out.data()).message().find("decodes to inf"), std::string_view::npos);
  }
  // topk: [k=2][idx 1][idx 3][v][v]
  b = encode("topk:0.5");
  std::string bad = b;
  const uint32_t out_of_range = 4;
  std::memcpy(&bad[8], &out_of_range, 4);
  expect_bad("topk:0.5", bad, "out of range");
  bad = b;
  std::memcpy(&bad[8], &b[4], 4);  // the same index twice
  expect_bad("topk:0.5", bad, "not increasing");
  bad = b;
  const uint32_t too_many = 5;
  std::memcpy(&bad[0], &too_many, 4);
  expect_bad("topk:0.5", bad, "5 of 4");
  bad = b;
  const uint32_t fewer = 1;
  std::memcpy(&bad[0], &fewer, 4);
  expect_bad("topk:0.5", bad.substr(0, 12), "expected 2");
  bad = b;
  std::memcpy(&bad[12], &nan, 4);
  expect_bad("topk:0.5", bad, "not finite");
  expect_bad("topk:0.5", "", "count");
}

TEST(CodecTest, CompressedSetsDescribeThemselvesAndAreChecked) {
  ParameterSet set;
  ASSERT_TRUE(set.Add({"w", {3, 4}, Random(12, 14)}).ok());
  ASSERT_TRUE(set.Add({"b", {3}, Random(3, 15)}).ok());
  auto c = Make("int8:channel");
  const std::string bytes = EncodeCompressedSet(*c, set);
  auto decoded = DecodeCompressedSet(bytes, "int8:channel", 1000);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  ASSERT_TRUE(decoded->SameLayout(set));
  auto direct = DecodeTensors(*c, bytes.substr(bytes.size() - EncodedTensorsSize(*c, set)), set);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(decoded->tensors()[0].values, direct->tensors()[0].values);
  auto code = [](const StatusOr<ParameterSet>& s) { return s.status().code(); };
  EXPECT_EQ(code(DecodeCompressedSet(bytes, "int8", 1000)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(DecodeCompressedSet(bytes, "int8:channel", 14)), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(DecodeCompressedSet(bytes.substr(0, 30), "int8:channel", 1000)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(DecodeCompressedSet("CLVP" + bytes.substr(4), "int8:channel", 1000)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(DecodeCompressedSet(bytes + "x", "int8:channel", 1000)),
            absl::StatusCode::kInvalidArgument);
  auto topk = Make("topk:0.5");
  EXPECT_EQ(code(DecodeCompressedSet(EncodeCompressedSet(*topk, set), "topk:0.5", 1000)),
            absl::StatusCode::kInvalidArgument)
      << "a broadcast cannot use a codec with per-client state";
}

TEST(CodecTest, UnknownSpecsAreRefused) {
  for (const char* spec : {"zip", "topk:0", "topk:1.5", "topk:x", "topk:0.1:ef22", "topk:ef21", "topk:noef", "topk:0.1:noef:ef21", "randk:0", "qsgd:0", "qsgd:128",
                           "qsgd", "powersgd:0", "powersgd:65", "int8:foo", "sign:2"}) {
    EXPECT_EQ(MakeCodec(spec).status().code(), absl::StatusCode::kInvalidArgument) << spec;
  }
  EXPECT_EQ(Make("fp32")->name(), "none");
  for (const char* spec : {"topk:0.1", "randk:0.1", "sign", "powersgd:2"}) {
    EXPECT_EQ(MakeStatelessCodec(spec, 0).status().code(), absl::StatusCode::kInvalidArgument) << spec;
  }
  for (const char* spec : {"fp16", "int8:channel:sr", "qsgd:8", "topk:0.1:noef"}) {
    EXPECT_TRUE(MakeStatelessCodec(spec, 0).ok()) << spec;
  }
  for (const auto& spec : kAllSpecs) {
    const auto families = SupportedCodecFamilies();
    EXPECT_NE(std::find(families.begin(), families.end(), CodecFamily(spec)), families.end()) << spec;
  }
}

// NF4 against an independent quantizer (tests/compression/nf4_reference.py) that builds
// the code table from the normal distribution's quantiles as bitsandbytes defines it.
TEST(CodecTest, Nf4QuantizesAsTheReference) {
  const std::string dir = ::testing::TempDir();
  const std::string in_path = dir + "/cleave_nf4_in.f32", out_path = dir + "/cleave_nf4_out.f32";
  // 1000 values: 15 full blocks and a partial one; one block of zeros; an outlier.
  std::vector<float> in = Random(1000, 21, 0.05f);
  std::fill(in.begin() + 128, in.begin() + 192, 0.0f);
  in[700] = 3.0f;
  {
    std::FILE* f = std::fopen(in_path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(in.data(), 4, in.size(), f);
    std::fclose(f);
  }
  const std::string cmd = std::string("/usr/bin/python3 ") + CLEAVE_SOURCE_DIR +
                          "/tests/compression/nf4_reference.py " + in_path + " " + out_path;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const int64_t blocks = 16;
  std::vector<float> ref(16 + blocks + in.size());
  {
    std::FILE* f = std::fopen(out_path.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fread(ref.data(), 4, ref.size(), f), ref.size());
    std::fclose(f);
  }
  auto c = Make("nf4");
  const std::string bytes = Encode(*c, in, {10, 100});
  ASSERT_EQ(bytes.size(), 4 * blocks + 500);
  // The table: the decoded value of code i in a block of absmax 1 is ref[i].
  for (int i = 0; i < 16; ++i) {
    std::string one(4 + 1, '\0');
    const float a = 1.0f;
    std::memcpy(&one[0], &a, 4);
    one[4] = static_cast<char>(i);
    float v[1];
    ASSERT_TRUE(c->Decode(one, {1}, v).ok());
    EXPECT_NEAR(v[0], ref[i], 1e-7) << "code " << i;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    float a;
    std::memcpy(&a, bytes.data() + 4 * b, 4);
    EXPECT_EQ(a, ref[16 + b]) << "block " << b;
  }
  std::vector<float> out(in.size());
  ASSERT_TRUE(c->Decode(bytes, {10, 100}, out.data()).ok());
  for (size_t i = 0; i < in.size(); ++i) ASSERT_NEAR(out[i], ref[16 + blocks + i], 1e-7) << i;
  // Double quantization moves each block's absmax by at most half of its int8 step (the
  // outlier's block sets it); each value is then within half the widest gap between codes
  // (1 - 0.7230) of that absmax.
  auto dq = Make("nf4:dq");
  const std::string small = Encode(*dq, in, {10, 100});
  EXPECT_EQ(small.size(), 4 + 4 + blocks + 500);
  std::vector<float> approx(in.size());
  ASSERT_TRUE(dq->Decode(small, {10, 100}, approx.data()).ok());
  const float half_step = 3.0f / 127 / 2;
  for (size_t i = 0; i < in.size(); ++i) {
    const float a = ref[16 + i / 64] + half_step;
    ASSERT_LE(std::abs(approx[i] - in[i]), 0.1386f * a + half_step + 1e-6f) << i;
  }
  EXPECT_EQ(approx[128], 0.0f);  // the block of zeros: absmax ~0, code 0
}

// A quantized set travels as CLVQ: it parses back sharing the received bytes, and a
// malformed one is refused naming what is wrong.
TEST(CodecTest, QuantizedSetsParseBackAndRefuseMalformedOnes) {
  auto codec = Make("nf4");
  QuantizedSet set;
  set.spec = "nf4";
  const auto a = Random(96 * 4, 5), b = Random(33, 6);
  set.tensors.push_back(QuantizeTensor(*codec, "1.q.weight", {96, 4}, a.data()));
  set.tensors.push_back(QuantizeTensor(*codec, "2.o.weight", {3, 11}, b.data()));
  auto blob = std::make_shared<const std::string>(set.Encode());
  auto back = QuantizedSet::Parse(blob, "nf4");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->tensors.size(), 2u);
  EXPECT_EQ(back->tensors[1].shape, (std::vector<int64_t>{3, 11}));
  EXPECT_EQ(back->tensors[1].bytes, set.tensors[1].bytes);
  EXPECT_EQ(back->tensors[0].bytes.data(), blob->data() + 4 + 4 + 4 + 3 + 4 + 4 + 10 + 4 + 16 + 8);  // no copy
  auto dequantized = DequantizeSet(*back);
  ASSERT_TRUE(dequantized.ok());
  std::vector<float> expect(33);
  ASSERT_TRUE(codec->Decode(set.tensors[1].bytes, {3, 11}, expect.data()).ok());
  EXPECT_EQ(dequantized->Find("2.o.weight")->values, expect);
  auto bad = [&](std::string bytes, const std::string& spec, const std::string& needle) {
    auto r = QuantizedSet::Parse(std::make_shared<const std::string>(std::move(bytes)), spec);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status();
  };
  bad(*blob, "nf4:dq", "expected nf4:dq");
  bad(blob->substr(0, blob->size() - 1), "nf4", "truncated");
  bad(*blob + "x", "nf4", "trailing");
  bad("CLVP" + blob->substr(4), "nf4", "bad magic");
  const float not_a_number = std::numeric_limits<float>::quiet_NaN();
  QuantizedSet nan_set = set;
  std::string broken(set.tensors[0].bytes);
  std::memcpy(&broken[0], &not_a_number, 4);
  nan_set.tensors[0].bytes = broken;
  bad(nan_set.Encode(), "nf4", "tensor 1.q.weight: nf4 scale");
  QuantizedSet twice = set;
  twice.tensors[1].name = "1.q.weight";
  bad(twice.Encode(), "nf4", "duplicate tensor name");
  QuantizedSet short_one = set;
  short_one.tensors[1].shape = {3, 12};
  bad(short_one.Encode(), "nf4", "2.o.weight: 21 bytes, nf4 encodes its shape in 22");
  QuantizedSet raw = set;
  raw.spec = "none";
  bad(raw.Encode(), "none", "needs a codec");
}

}  // namespace
}  // namespace cleave
