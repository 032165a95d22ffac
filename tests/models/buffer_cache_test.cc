// LibTorch's large CPU buffers are kept when freed (SetTorchBufferCache, models/model.h)
// and handed to the next request of their size, up to the cap; small ones are not.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "models/model.h"

namespace cleave {
namespace {

TEST(TorchBufferCacheTest, ALargeFreedBufferIsReusedUpToTheCap) {
  SetTorchBufferCache(int64_t{48} << 20);
  const int64_t large = int64_t{5} << 20;  // floats: 20 MiB
  void* first = nullptr;
  void* second = nullptr;
  {
    auto a = torch::ones({large});
    auto b = torch::ones({large});
    first = a.data_ptr();
    second = b.data_ptr();
  }  // a then b freed: 40 MiB kept
  {
    auto c = torch::zeros({large});  // the same size: one of the kept buffers, zeroed as asked
    EXPECT_TRUE(c.data_ptr() == first || c.data_ptr() == second);
    EXPECT_EQ(c.sum().item<float>(), 0.0f);
    auto d = torch::empty({large});
    EXPECT_TRUE(d.data_ptr() == first || d.data_ptr() == second);
    EXPECT_NE(c.data_ptr(), d.data_ptr());
  }
  {
    auto a = torch::empty({large});
    auto b = torch::empty({large});
    auto c = torch::empty({large});  // not kept (over the cap): newly allocated, 60 MiB live
    for (auto* t : {&a, &b, &c}) t->fill_(1.0f);
    EXPECT_EQ((a + b + c).sum().item<float>(), 3.0f * large);
  }
  SetTorchBufferCache(0);  // lowering the cap frees what is kept
  SetTorchBufferCache(int64_t{1} << 30);
  auto e = torch::ones({large});
  EXPECT_EQ(e.sum().item<float>(), static_cast<float>(large));
}

}  // namespace
}  // namespace cleave
