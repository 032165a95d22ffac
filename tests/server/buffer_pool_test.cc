// Upload buffers: a returned buffer is handed out again (its memory kept, its bytes
// cleared), the pool keeps at most as many as uploads read at once, and Drop frees them.
#include "server/transport/buffer_pool.h"

#include <gtest/gtest.h>

#include <string>

namespace cleave {
namespace {

TEST(BufferPoolTest, AReturnedBufferIsReusedEmpty) {
  BufferPool pool(2);
  std::string a = pool.Take(1 << 20);
  EXPECT_TRUE(a.empty());
  EXPECT_GE(a.capacity(), 1u << 20);
  a.assign(1000, 'x');
  const char* memory = a.data();
  pool.Return(std::move(a));
  EXPECT_EQ(pool.pooled(), 1);

  std::string b = pool.Take(100);
  EXPECT_EQ(pool.pooled(), 0);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(b.data(), memory);  // the same allocation, not a fresh one
  EXPECT_GE(b.capacity(), 1u << 20);
}

TEST(BufferPoolTest, KeepsAtMostItsBoundAndDropFreesThem) {
  BufferPool pool(2);
  for (int i = 0; i < 3; ++i) pool.Return(std::string(64, 'y'));
  EXPECT_EQ(pool.pooled(), 2);
  pool.Drop();
  EXPECT_EQ(pool.pooled(), 0);
  EXPECT_TRUE(pool.Take(10).empty());  // a fresh one when the pool is empty
}

}  // namespace
}  // namespace cleave
