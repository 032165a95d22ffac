// Split tensors in chunks (proto/split_chunks.h): what is sent comes back whole, and a
// stream that breaks the chunking rules is refused.
#include "proto/split_chunks.h"

#include <gtest/gtest.h>

namespace cleave {
namespace {

v1::SplitUp Batch(int64_t seq, size_t bytes) {
  v1::SplitUp m;
  m.mutable_batch()->set_seq(seq);
  m.mutable_batch()->add_labels(3);
  std::string data(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 7);
  m.mutable_batch()->mutable_activations()->set_data(data);
  m.mutable_batch()->mutable_activations()->add_shape(static_cast<int64_t>(bytes / 4));
  return m;
}

TEST(SplitChunksTest, LargeTensorsTravelInChunksAndComeBackWhole) {
  const v1::SplitUp small = Batch(1, 1000);
  EXPECT_EQ(Chunked(small).size(), 1u);
  const v1::SplitUp big = Batch(2, 3 * kSplitChunkBytes + 5);
  std::vector<v1::SplitUp> pieces = Chunked(big);
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_TRUE(pieces[0].batch().activations().more());
  EXPECT_EQ(pieces[0].batch().activations().data().size(), kSplitChunkBytes);
  EXPECT_TRUE(pieces[3].chunk().last());
  EXPECT_FALSE(pieces[2].chunk().last());
  ChunkAssembler<v1::SplitUp> in(4 * kSplitChunkBytes);
  for (size_t i = 0; i + 1 < pieces.size(); ++i) {
    auto r = in.Add(pieces[i]);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->has_value());
  }
  auto whole = in.Add(pieces[3]);
  ASSERT_TRUE(whole.ok() && whole->has_value());
  EXPECT_EQ((*whole)->batch().activations().data(), big.batch().activations().data());
  EXPECT_FALSE((*whole)->batch().activations().more());
  EXPECT_EQ((*whole)->batch().labels(0), 3);
  auto next = in.Add(small);  // and the stream goes on
  ASSERT_TRUE(next.ok() && next->has_value());
}

TEST(SplitChunksTest, ChunksOutOfPlaceOrOversizedAreRefused) {
  const std::vector<v1::SplitUp> pieces = Chunked(Batch(2, 2 * kSplitChunkBytes + 1));
  ASSERT_EQ(pieces.size(), 3u);
  auto expect = [](const StatusOr<std::optional<v1::SplitUp>>& r, const std::string& what) {
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_NE(std::string(r.status().message()).find(what), std::string::npos) << r.status();
  };
  ChunkAssembler<v1::SplitUp> a(8 * kSplitChunkBytes);
  expect(a.Add(pieces[1]), "no tensor to continue");
  ChunkAssembler<v1::SplitUp> b(8 * kSplitChunkBytes);
  ASSERT_TRUE(b.Add(pieces[0]).ok());
  expect(b.Add(Batch(3, 10)), "inside an unfinished chunked tensor");
  ChunkAssembler<v1::SplitUp> c(8 * kSplitChunkBytes);
  ASSERT_TRUE(c.Add(pieces[0]).ok());
  v1::SplitUp other = pieces[1];
  other.mutable_chunk()->set_seq(9);
  expect(c.Add(other), "a chunk of micro-batch 9 inside micro-batch 2");
  ChunkAssembler<v1::SplitUp> d(kSplitChunkBytes + 10);  // the bound holds across chunks
  ASSERT_TRUE(d.Add(pieces[0]).ok());
  expect(d.Add(pieces[1]), "a tensor of more than");
}

}  // namespace
}  // namespace cleave
