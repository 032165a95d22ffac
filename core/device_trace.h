// Device traces: per-client compute speed, links and availability over time, for
// `cleave local` and `cleave simulate` (config key local.trace). A CSV file, one line per
// client (client i takes line i mod n), documented in docs/configuration.md:
//
//   client,slowdown,uplink_mbps,downlink_mbps,online
//   0,1,50,100,
//   1,6.5,2,8,0-120;300-
//   2,2,10,40,none
//
// A sixth column, memory_mb (header ...,online,memory_mb), gives each device the memory
// it lends to training (cleave-client --memory-limit-mb; 0 = no limit).
//
// `online`: the windows (seconds since the federation started) in which the client is
// connected, `START-END` separated by ';', the last one may be open (`START-`); empty =
// always, `none` = never. Outside its windows a client is stopped (a dropout: its task
// fails) and it joins again when its next window opens.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace cleave {

// A device to emulate (cleave-client --emulate-*, local.profiles, a trace's line): link
// speed, slower compute, memory.
struct DeviceEmulation {
  double uplink_mbps = 0;        // 0 = not limited
  double downlink_mbps = 0;
  double slowdown = 1;           // compute takes this many times longer
  int64_t memory_limit_mb = 0;   // declared to the server's cut policy; 0 = none
};

struct DeviceTrace {
  DeviceEmulation device;  // slowdown, uplink_mbps, downlink_mbps (0 = not limited)
  bool always_online = true;
  // Sorted, disjoint [start, end) windows; end = infinity for an open one.
  std::vector<std::pair<double, double>> online;

  bool OnlineAt(double t) const;
};

// Parses a trace file's text (`what` names it in errors: line and field).
StatusOr<std::vector<DeviceTrace>> ParseDeviceTraces(const std::string& text,
                                                     const std::string& what);
StatusOr<std::vector<DeviceTrace>> ReadDeviceTraces(const std::string& path);
// The file format for `traces` (ParseDeviceTraces reads it back unchanged).
std::string FormatDeviceTraces(const std::vector<DeviceTrace>& traces);

// A generator for common heterogeneity (`cleave trace`).
struct TraceSpec {
  int clients = 100;
  uint64_t seed = 1;
  // Slowdown log-uniform in [1, speed_spread] (1 = every device alike).
  double speed_spread = 1;
  // Link speeds log-uniform in [min, max] Mbps; 0 = not limited.
  double uplink_min_mbps = 0, uplink_max_mbps = 0;
  double downlink_min_mbps = 0, downlink_max_mbps = 0;
  // Availability: the long-run fraction of time a client is online (1 = always), as
  // alternating sessions with exponential lengths, online ones of mean session_s, up to
  // horizon_s (then online for good).
  double online_fraction = 1;
  double session_s = 600;
  double horizon_s = 24 * 3600;
  // Device tiers (`cleave trace --tiers`), in equal numbers: client i is of tier
  // i mod tiers.size(), whose memory it lends to training and whose slowdown multiplies
  // its speed draw. Empty: no tiers (no memory limit).
  struct Tier {
    int64_t memory_mb = 0;
    double slowdown = 1;
  };
  std::vector<Tier> tiers;
};
// Tiers written MEMORY_MB:SLOWDOWN,... ("4096:1,1024:4,256:16").
StatusOr<std::vector<TraceSpec::Tier>> ParseTiers(const std::string& text);
StatusOr<std::vector<DeviceTrace>> GenerateDeviceTraces(const TraceSpec& spec);

}  // namespace cleave
