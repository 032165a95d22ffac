#include "core/device_trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace cleave {
namespace {

constexpr char kHeader[] = "client,slowdown,uplink_mbps,downlink_mbps,online\n";

TEST(DeviceTraceTest, ParsesSpeedsLinksAndWindows) {
  auto t = ParseDeviceTraces(std::string("# a comment\n") + kHeader +
                                 "0,1,50,100,\n"
                                 "1, 6.5 ,2,8,0-120;300-\n"
                                 "2,2,0,0,none\n",
                             "t.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 3u);
  EXPECT_EQ((*t)[0].device.uplink_mbps, 50);
  EXPECT_EQ((*t)[0].device.downlink_mbps, 100);
  EXPECT_TRUE((*t)[0].OnlineAt(1e9));
  EXPECT_EQ((*t)[1].device.slowdown, 6.5);
  for (auto [when, online] : {std::pair{0.0, true}, {119.9, true}, {120.0, false}, {299.0, false},
                              {300.0, true}, {1e9, true}}) {
    EXPECT_EQ((*t)[1].OnlineAt(when), online) << when;
  }
  EXPECT_FALSE((*t)[2].OnlineAt(0));
  EXPECT_FALSE((*t)[2].OnlineAt(1e9));
  auto again = ParseDeviceTraces(FormatDeviceTraces(*t), "formatted");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(FormatDeviceTraces(*again), FormatDeviceTraces(*t));
}

TEST(DeviceTraceTest, BadLinesNameTheLineAndTheField) {
  const std::string h = kHeader;
  for (const auto& [text, says] : std::vector<std::pair<std::string, std::string>>{
           {"client,speed\n0,1\n", "t.csv:1: the first line must be"},
           {h + "0,1,0,0\n", "t.csv:2: 4 fields, expected 5"},
           {h + "1,1,0,0,\n", "t.csv:2: client '1', expected 0"},
           {h + "0,0.5,0,0,\n", "t.csv:2 slowdown: '0.5' is not a number >= 1"},
           {h + "0,1,-1,0,\n", "uplink_mbps: '-1' is not a number >= 0"},
           {h + "0,1,0,nan,\n", "downlink_mbps: 'nan'"},
           {h + "0,1,0,0,5\n", "window '5' is not START-END or START-"},
           {h + "0,1,0,0,10-5\n", "window '10-5' ends before it starts"},
           {h + "0,1,0,0,0-10;5-20\n", "window '5-20' starts before the previous one ends"},
           {h + "0,1,0,0,0-;5-20\n", "window '5-20' starts before the previous one ends"},
           {h, "t.csv: no clients"},
       }) {
    auto t = ParseDeviceTraces(text, "t.csv");
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(says), std::string::npos) << t.status().message();
  }
}

TEST(DeviceTraceTest, GeneratedTracesFollowTheSpecAndTheSeed) {
  TraceSpec s;
  s.clients = 300;
  s.seed = 9;
  s.speed_spread = 10;
  s.uplink_min_mbps = 1;
  s.uplink_max_mbps = 20;
  s.online_fraction = 0.6;
  s.session_s = 100;
  s.horizon_s = 20000;
  auto t = GenerateDeviceTraces(s);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 300u);
  double slow_min = 1e9, slow_max = 0, online = 0;
  for (const DeviceTrace& d : *t) {
    slow_min = std::min(slow_min, d.device.slowdown);
    slow_max = std::max(slow_max, d.device.slowdown);
    EXPECT_GE(d.device.uplink_mbps, 1);
    EXPECT_LE(d.device.uplink_mbps, 20);
    EXPECT_EQ(d.device.downlink_mbps, 0);
    ASSERT_FALSE(d.always_online);
    ASSERT_FALSE(d.online.empty());
    EXPECT_TRUE(std::isinf(d.online.back().second)) << "online for good after the horizon";
    for (const auto& [start, end] : d.online) online += std::min(end, s.horizon_s) - std::min(start, s.horizon_s);
  }
  EXPECT_GE(slow_min, 1);
  EXPECT_LE(slow_max, 10);
  EXPECT_GT(slow_max / slow_min, 5) << "log-uniform over the spread";
  EXPECT_NEAR(online / (300 * s.horizon_s), 0.6, 0.05);
  // The same seed, the same file; another seed, another; the file reads back as written.
  EXPECT_EQ(FormatDeviceTraces(*GenerateDeviceTraces(s)), FormatDeviceTraces(*t));
  TraceSpec other = s;
  other.seed = 10;
  EXPECT_NE(FormatDeviceTraces(*GenerateDeviceTraces(other)), FormatDeviceTraces(*t));
  auto back = ParseDeviceTraces(FormatDeviceTraces(*t), "generated");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(FormatDeviceTraces(*back), FormatDeviceTraces(*t));

  TraceSpec always;
  always.clients = 3;
  const auto always_traces = GenerateDeviceTraces(always);  // not a temporary's contents
  ASSERT_TRUE(always_traces.ok());
  for (const DeviceTrace& d : *always_traces) {
    EXPECT_TRUE(d.always_online);
    EXPECT_EQ(d.device.slowdown, 1);
  }
  for (auto edit : std::vector<void (*)(TraceSpec*)>{
           [](TraceSpec* x) { x->clients = 0; }, [](TraceSpec* x) { x->speed_spread = 0.5; },
           [](TraceSpec* x) { x->online_fraction = 0; },
           [](TraceSpec* x) { x->uplink_min_mbps = 5; },  // no max
           [](TraceSpec* x) { x->session_s = 0; }}) {
    TraceSpec bad;
    edit(&bad);
    EXPECT_EQ(GenerateDeviceTraces(bad).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// Memory/compute tiers: the sixth column lends each device its memory; `cleave trace
// --tiers` deals the tiers out in equal numbers and reads back unchanged.
TEST(DeviceTraceTest, TiersGiveMemoryAndSlowdownAndReadBack) {
  auto t = ParseDeviceTraces("client,slowdown,uplink_mbps,downlink_mbps,online,memory_mb\n0,1,0,0,,4096\n1,4,0,0,,0\n",
                             "t.csv");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)[0].device.memory_limit_mb, 4096);
  EXPECT_EQ((*t)[1].device.memory_limit_mb, 0);
  EXPECT_FALSE(ParseDeviceTraces(std::string(kHeader) + "0,1,0,0,,256\n", "t.csv").ok()) << "6 fields, 5-column header";
  EXPECT_FALSE(ParseDeviceTraces("client,slowdown,uplink_mbps,downlink_mbps,online,memory_mb\n0,1,0,0,,1.5\n", "t.csv").ok());

  auto tiers = ParseTiers("4096:1, 1024:4,256:16");
  ASSERT_TRUE(tiers.ok()) << tiers.status();
  EXPECT_FALSE(ParseTiers("256").ok());
  EXPECT_FALSE(ParseTiers("256:0.5").ok()) << "faster than no slowdown";
  TraceSpec spec;
  spec.clients = 7;
  spec.speed_spread = 2;
  spec.tiers = *tiers;
  auto g = GenerateDeviceTraces(spec);
  ASSERT_TRUE(g.ok()) << g.status();
  for (size_t i = 0; i < g->size(); ++i) {
    const DeviceTrace& d = (*g)[i];
    EXPECT_EQ(d.device.memory_limit_mb, (std::vector<int64_t>{4096, 1024, 256})[i % 3]) << i;
    const double tier = (std::vector<double>{1, 4, 16})[i % 3];
    EXPECT_GE(d.device.slowdown, tier * 0.999) << i;
    EXPECT_LE(d.device.slowdown, tier * 2 * 1.001) << i;
  }
  auto back = ParseDeviceTraces(FormatDeviceTraces(*g), "back");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(FormatDeviceTraces(*back), FormatDeviceTraces(*g));
}

}  // namespace
}  // namespace cleave
