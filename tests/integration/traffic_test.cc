// bytes_up / bytes_down are transport bytes: the server's count agrees with what a TCP
// relay between clients and server carried, and compression shrinks both.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/integration/federation.h"
#include "tests/integration/tcp_proxy.h"

namespace cleave {
namespace {

struct Traffic {
  int64_t proxy_up = 0, proxy_down = 0, server_up = 0, server_down = 0;
  std::vector<RoundMetrics> rounds;
};

Traffic RunThroughProxy(const std::string& compression) {
  std::unique_ptr<TcpProxy> proxy;
  Traffic t;
  {
    Federation f;
    f.dial = [&](int port) {
      if (!proxy) proxy = std::make_unique<TcpProxy>(port);  // one for all clients
      return proxy->address();
    };
    f.Start("model: {name: lenet5}\nrun: {rounds: 2, seed: 1}\n"
            "clients: {min: 2, quorum: 1.0}\ntrain: {local_epochs: 1, batch_size: 32}\n"
            "compression: " + compression + "\n",
            Options(2, 1000));
    f.Join();
    EXPECT_TRUE(f.server_status.ok()) << f.server_status;
    std::tie(t.server_up, t.server_down) = f.server->TransportBytes();
    t.rounds = f.server->History();
  }
  t.proxy_up = proxy->up();
  t.proxy_down = proxy->down();
  return t;
}

TEST(TrafficTest, ServerCountsWhatCrossedTheTransport) {
  std::vector<Traffic> runs;
  for (const std::string compression :
       {"{}", "{update: int8, broadcast: int8}", "{update: \"topk:0.01\"}"}) {
    runs.push_back(RunThroughProxy(compression));
    const Traffic& t = runs.back();
    ASSERT_EQ(t.rounds.size(), 2u) << compression;
    const double up = static_cast<double>(t.server_up) / t.proxy_up;
    const double down = static_cast<double>(t.server_down) / t.proxy_down;
    std::printf("%s: up %lld counted / %lld carried (%.4f), down %lld / %lld (%.4f)\n",
                compression.c_str(), static_cast<long long>(t.server_up),
                static_cast<long long>(t.proxy_up), up, static_cast<long long>(t.server_down),
                static_cast<long long>(t.proxy_down), down);
    EXPECT_NEAR(up, 1.0, 0.02) << compression;
    EXPECT_NEAR(down, 1.0, 0.02) << compression;
  }
  const auto& fp32 = runs[0].rounds;
  const auto& int8 = runs[1].rounds;
  const auto& topk = runs[2].rounds;
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(fp32[r].bytes_up_fp32, fp32[r].bytes_up);
    EXPECT_EQ(fp32[r].bytes_down_fp32, fp32[r].bytes_down);
    // The fp32 equivalent of a compressed round is what the fp32 run really sent.
    EXPECT_NEAR(static_cast<double>(int8[r].bytes_up_fp32) / fp32[r].bytes_up, 1.0, 0.03);
    EXPECT_NEAR(static_cast<double>(int8[r].bytes_down_fp32) / fp32[r].bytes_down, 1.0, 0.03);
    EXPECT_NEAR(static_cast<double>(topk[r].bytes_up_fp32) / fp32[r].bytes_up, 1.0, 0.03);
    EXPECT_GE(static_cast<double>(int8[r].bytes_up_fp32) / int8[r].bytes_up, 3.9);
    EXPECT_GE(static_cast<double>(int8[r].bytes_down_fp32) / int8[r].bytes_down, 3.9);
    EXPECT_GE(static_cast<double>(topk[r].bytes_up_fp32) / topk[r].bytes_up, 30);
  }
}

}  // namespace
}  // namespace cleave
