#include "core/parameter_set.h"
#include "core/printable.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

namespace cleave {
namespace {

ParameterSet Sample() {
  ParameterSet ps;
  EXPECT_TRUE(ps.Add({"w", {2, 3}, {1, 2, 3, 4, 5, 6}}).ok());
  EXPECT_TRUE(ps.Add({"b", {3}, {-1.5f, 0, 7}}).ok());
  EXPECT_TRUE(ps.Add({"s", {}, {42}}).ok());
  return ps;
}

TEST(ParameterSetTest, EncodeDecodeRoundTrip) {
  ParameterSet ps = Sample();
  std::string bytes = ps.Encode();
  EXPECT_EQ(bytes.size(), ps.EncodedSize());
  auto back = ParameterSet::Decode(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back->tensors()[i].name, ps.tensors()[i].name);
    EXPECT_EQ(back->tensors()[i].shape, ps.tensors()[i].shape);
    EXPECT_EQ(back->tensors()[i].values, ps.tensors()[i].values);
  }
  EXPECT_EQ(back->total_elements(), 10);
}

// The digest computed as it goes is the content address of the encoding (the blob a
// server sends), and any change of a value, a name or a shape changes it.
TEST(ParameterSetTest, TheDigestOfViewsIsTheDigestOfTheEncoding) {
  ParameterSet ps = Sample();
  const std::string digest = EncodedSha256Hex(ViewsOf(ps));
  EXPECT_EQ(digest, Sha256Hex(ps.Encode()));
  EXPECT_EQ(EncodedSha256Hex({}), Sha256Hex(ParameterSet().Encode()));
  ParameterSet value = ps, shape = ps;
  value.mutable_tensors()[1].values[2] = 7.5f;
  shape.mutable_tensors()[0].shape = {3, 2};
  EXPECT_NE(EncodedSha256Hex(ViewsOf(value)), digest);
  EXPECT_NE(EncodedSha256Hex(ViewsOf(shape)), digest);
  std::vector<TensorView> renamed = ViewsOf(ps);
  renamed[2].name = "t";
  EXPECT_NE(EncodedSha256Hex(renamed), digest);
}

TEST(ParameterSetTest, AddRejectsBadTensors) {
  ParameterSet ps;
  EXPECT_EQ(ps.Add({"w", {2, 2}, {1, 2, 3}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ps.Add({"w", {1}, {1}}).ok());
  EXPECT_EQ(ps.Add({"w", {1}, {1}}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParameterSetTest, DecodeRejectsEveryTruncation) {
  std::string bytes = Sample().Encode();
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = ParameterSet::Decode(std::string_view(bytes.data(), n));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << "prefix " << n;
  }
}

TEST(ParameterSetTest, DecodeRejectsMalformedInput) {
  std::string good = Sample().Encode();
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_FALSE(ParameterSet::Decode(bad_magic).ok());
  EXPECT_FALSE(ParameterSet::Decode(good + "x").ok()) << "trailing bytes";
  std::string bad_version = good;
  bad_version[4] = 9;
  EXPECT_FALSE(ParameterSet::Decode(bad_version).ok());
  // dtype byte of the first tensor: after magic(4) version(4) count(4) len(4) name(1).
  std::string bad_dtype = good;
  bad_dtype[17] = 7;
  EXPECT_FALSE(ParameterSet::Decode(bad_dtype).ok());
  // A dim that disagrees with the byte length: first dim at offset 22.
  std::string bad_dim = good;
  int64_t three = 3;
  std::memcpy(&bad_dim[22], &three, 8);
  auto r = ParameterSet::Decode(bad_dim);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("bytes for shape"), std::string::npos) << r.status();
}

TEST(ParameterSetTest, DecodeEnforcesElementLimit) {
  std::string bytes = Sample().Encode();
  EXPECT_TRUE(ParameterSet::Decode(bytes, 10).ok());
  EXPECT_FALSE(ParameterSet::Decode(bytes, 9).ok());
}

TEST(ParameterSetTest, DecodeRejectsDuplicateNames) {
  ParameterSet a;
  ASSERT_TRUE(a.Add({"x", {1}, {1}}).ok());
  std::string one = a.Encode();
  // Build "x","x" by hand: header with count 2 then the tensor record twice.
  std::string rec = one.substr(12);
  std::string two = one.substr(0, 8);
  uint32_t count = 2;
  two.append(reinterpret_cast<const char*>(&count), 4);
  two += rec + rec;
  auto r = ParameterSet::Decode(two);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("duplicate"), std::string::npos);
}

TEST(ParameterSetTest, CheckViewsFindsLayoutAndNonFiniteProblems) {
  ParameterSet ps = Sample();
  std::string bytes = ps.Encode();
  auto views = ParseParameterSet(bytes);
  ASSERT_TRUE(views.ok());
  EXPECT_TRUE(CheckViews(ps, *views).ok());

  ParameterSet nan = ps;
  nan.mutable_tensors()[1].values[2] = std::numeric_limits<float>::quiet_NaN();
  std::string nan_bytes = nan.Encode();
  auto nan_views = ParseParameterSet(nan_bytes);
  ASSERT_TRUE(nan_views.ok());
  Status s = CheckViews(ps, *nan_views);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("non-finite"), std::string::npos);

  ParameterSet inf = ps;
  inf.mutable_tensors()[0].values[0] = std::numeric_limits<float>::infinity();
  std::string inf_bytes = inf.Encode();
  EXPECT_FALSE(CheckViews(ps, *ParseParameterSet(inf_bytes)).ok());

  ParameterSet shape;
  ASSERT_TRUE(shape.Add({"w", {3, 2}, {1, 2, 3, 4, 5, 6}}).ok());
  ASSERT_TRUE(shape.Add({"b", {3}, {0, 0, 0}}).ok());
  ASSERT_TRUE(shape.Add({"s", {}, {0}}).ok());
  std::string shape_bytes = shape.Encode();
  s = CheckViews(ps, *ParseParameterSet(shape_bytes));
  EXPECT_NE(s.message().find("expected shape [2,3], got [3,2]"), std::string::npos) << s;

  ParameterSet fewer;
  ASSERT_TRUE(fewer.Add({"w", {2, 3}, {1, 2, 3, 4, 5, 6}}).ok());
  std::string fewer_bytes = fewer.Encode();
  EXPECT_FALSE(CheckViews(ps, *ParseParameterSet(fewer_bytes)).ok());
}

TEST(ParameterSetTest, Sha256MatchesKnownVector) {
  EXPECT_EQ(Sha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(CheckViewsTest, BoundsMagnitudesAndRefusesNonFiniteValues) {
  ParameterSet ps;
  ASSERT_TRUE(ps.Add({"w", {4}, {1.0f, -2.0f, 3.0f, -4.0f}}).ok());
  EXPECT_TRUE(CheckViews(ps, ViewsOf(ps)).ok());
  EXPECT_TRUE(CheckViews(ps, ViewsOf(ps), 4.0f).ok()) << "the bound itself is allowed";
  auto over = CheckViews(ps, ViewsOf(ps), 3.5f);
  EXPECT_EQ(over.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(over.message().find("index 3"), std::string::npos) << over;
  ps.mutable_tensors()[0].values[1] = -std::numeric_limits<float>::infinity();
  auto inf = CheckViews(ps, ViewsOf(ps), 1e30f);
  EXPECT_NE(inf.message().find("non-finite value at index 1"), std::string::npos) << inf;
  ps.mutable_tensors()[0].values[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(CheckViews(ps, ViewsOf(ps)).ok());
}

TEST(PersonalTensorsTest, GlobsSelectSplitAndMergeByName) {
  ParameterSet ps;
  ASSERT_TRUE(ps.Add({"conv.weight", {2}, {1, 2}}).ok());
  ASSERT_TRUE(ps.Add({"bn.running_mean", {1}, {3}}).ok());
  ASSERT_TRUE(ps.Add({"head.weight", {2}, {4, 5}}).ok());
  ASSERT_TRUE(ps.Add({"head.bias", {1}, {6}}).ok());
  // In the set's order, each name once, whatever the order and overlap of the patterns.
  auto names = MatchTensorNames(ps, {"head.*", "*.running_*", "head.bias"});
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, (std::vector<std::string>{"bn.running_mean", "head.weight", "head.bias"}));
  auto none = MatchTensorNames(ps, {"head.*", "fc.*"});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("'fc.*' matches no tensor"), std::string::npos);
  EXPECT_NE(none.status().message().find("conv.weight bn.running_mean head.weight head.bias"),
            std::string::npos) << none.status();

  ParameterSet personal = Only(ps, *names), shared = Without(ps, *names);
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared.tensors()[0].name, "conv.weight");
  ASSERT_EQ(personal.size(), 3u);
  EXPECT_EQ(personal.tensors()[2].values, std::vector<float>{6});

  ParameterSet other = ps.ZerosLike();
  ASSERT_TRUE(Overwrite(personal, &other).ok());
  EXPECT_EQ(other.tensors()[0].values, (std::vector<float>{0, 0})) << "shared tensors untouched";
  EXPECT_EQ(other.tensors()[2].values, (std::vector<float>{4, 5}));
  // A part that does not fit changes nothing, even where its first tensors would fit.
  ParameterSet bad;
  ASSERT_TRUE(bad.Add({"head.weight", {2}, {9, 9}}).ok());
  ASSERT_TRUE(bad.Add({"head.bias", {2}, {9, 9}}).ok());
  EXPECT_EQ(Overwrite(bad, &other).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(other.tensors()[2].values, (std::vector<float>{4, 5}));
  ParameterSet absent;
  ASSERT_TRUE(absent.Add({"fc.bias", {1}, {1}}).ok());
  EXPECT_EQ(Overwrite(absent, &other).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PrintableTest, EscapesAndBoundsUntrustedText) {
  EXPECT_EQ(Printable("client-7"), "client-7");
  EXPECT_EQ(Printable(std::string("a\nb\0c\\", 6)), "a\\x0ab\\x00c\\x5c");
  EXPECT_EQ(Printable(std::string(100, 'x'), 4), "xxxx...(100 bytes)");
}

}  // namespace
}  // namespace cleave
