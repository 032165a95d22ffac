// Per-slice masking on the device: where a submodel's values sit in the summed vector,
// from the placement the server sends, and the placements it refuses.
#include "client/secagg_client.h"

#include <gtest/gtest.h>

namespace cleave {
namespace {

// A tensor of `shape` at `offset` keeping `kept[d]` of each dimension.
v1::SubmodelPlacement Placed(int64_t offset, std::vector<int64_t> shape, std::vector<std::vector<int64_t>> kept) {
  v1::SubmodelPlacement p;
  p.set_offset(offset);
  for (int64_t s : shape) p.add_shape(s);
  for (const auto& dim : kept) {
    auto* list = p.add_dims();
    for (int64_t i : dim) list->add_index(i);
  }
  return p;
}

google::protobuf::RepeatedPtrField<v1::SubmodelPlacement> Of(std::vector<v1::SubmodelPlacement> tensors) {
  google::protobuf::RepeatedPtrField<v1::SubmodelPlacement> out;
  for (auto& t : tensors) *out.Add() = std::move(t);
  return out;
}

TEST(PlacedPositionsTest, RowMajorOverEachDimensionsKeptIndicesAtEachTensorsOffset) {
  // A 3x4 matrix keeping rows {2, 0} and columns {1, 3}, then a vector of 5 keeping {4}.
  auto p = PlacedPositions(Of({Placed(0, {3, 4}, {{2, 0}, {1, 3}}), Placed(12, {5}, {{4}})}), 17);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, (std::vector<int64_t>{9, 11, 1, 3, 16}));
}

TEST(PlacedPositionsTest, RefusesPlacementsOutsideTheVectorOrTwoValuesAtOnePosition) {
  const auto refused = [](std::vector<v1::SubmodelPlacement> t, int64_t length) {
    auto p = PlacedPositions(Of(std::move(t)), length);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << length;
  };
  refused({Placed(0, {3, 4}, {{3}, {0}})}, 12);             // an index outside its dimension
  refused({Placed(0, {3, 4}, {{0}})}, 12);                  // a kept list missing
  refused({Placed(6, {3, 4}, {{0}, {0}})}, 12);             // the tensor runs past the vector
  refused({Placed(0, {4}, {{1, 1}})}, 12);                  // an index twice
  refused({Placed(0, {4}, {{1}}), Placed(1, {4}, {{0}})}, 12);  // tensors overlapping on a value
  refused({Placed(0, {4}, {{1}})}, 0);                      // no vector
}

}  // namespace
}  // namespace cleave
