#include "core/device_trace.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/files.h"

namespace cleave {
namespace {

constexpr double kForever = std::numeric_limits<double>::infinity();
constexpr char kHeader[] = "client,slowdown,uplink_mbps,downlink_mbps,online";
constexpr char kMemoryHeader[] = "client,slowdown,uplink_mbps,downlink_mbps,online,memory_mb";

StatusOr<double> Number(absl::string_view field, const std::string& where, double min) {
  double v = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(field), &v) || !std::isfinite(v) || v < min) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": '", field, "' is not a number >= ", min));
  }
  return v;
}

StatusOr<std::vector<std::pair<double, double>>> Windows(absl::string_view field,
                                                          const std::string& where) {
  std::vector<std::pair<double, double>> out;
  for (absl::string_view w : absl::StrSplit(field, ';')) {
    w = absl::StripAsciiWhitespace(w);
    std::pair<absl::string_view, absl::string_view> se = absl::StrSplit(w, absl::MaxSplits('-', 1));
    if (w.find('-') == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": window '", w, "' is not START-END or START-"));
    }
    ASSIGN_OR_RETURN(double start, Number(se.first, where, 0));
    double end = kForever;
    if (!absl::StripAsciiWhitespace(se.second).empty()) {
      ASSIGN_OR_RETURN(end, Number(se.second, where, 0));
    }
    if (end <= start) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": window '", w, "' ends before it starts"));
    }
    if (!out.empty() && start < out.back().second) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": window '", w, "' starts before the previous one ends (windows in order, apart)"));
    }
    out.emplace_back(start, end);
  }
  return out;
}

std::string Num(double v) { return absl::StrFormat("%.10g", v); }

}  // namespace

bool DeviceTrace::OnlineAt(double t) const {
  if (always_online) return true;
  for (const auto& [start, end] : online) {
    if (t < start) return false;
    if (t < end) return true;
  }
  return false;
}

StatusOr<std::vector<DeviceTrace>> ParseDeviceTraces(const std::string& text,
                                                     const std::string& what) {
  std::vector<DeviceTrace> out;
  int line_no = 0;
  bool header = false;
  size_t fields = 5;  // 6 with memory_mb
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = absl::StrCat(what, ":", line_no);
    if (!header) {
      if (line != kHeader && line != kMemoryHeader) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": the first line must be '", kHeader, "' or '", kMemoryHeader, "'"));
      }
      fields = line == kHeader ? 5 : 6;
      header = true;
      continue;
    }
    std::vector<absl::string_view> f = absl::StrSplit(line, ',');
    if (f.size() != fields) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", f.size(), " fields, expected ", fields, " (",
                                                     fields == 5 ? kHeader : kMemoryHeader, ")"));
    }
    int64_t client = -1;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(f[0]), &client) ||
        client != static_cast<int64_t>(out.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": client '", f[0], "', expected ", out.size(), " (clients numbered in order from 0)"));
    }
    DeviceTrace t;
    ASSIGN_OR_RETURN(t.device.slowdown, Number(f[1], where + " slowdown", 1));
    ASSIGN_OR_RETURN(t.device.uplink_mbps, Number(f[2], where + " uplink_mbps", 0));
    ASSIGN_OR_RETURN(t.device.downlink_mbps, Number(f[3], where + " downlink_mbps", 0));
    if (fields == 6) {
      ASSIGN_OR_RETURN(const double mb, Number(f[5], where + " memory_mb", 0));
      if (mb != std::floor(mb)) return absl::InvalidArgumentError(absl::StrCat(where, " memory_mb: whole MiB"));
      t.device.memory_limit_mb = static_cast<int64_t>(mb);
    }
    const absl::string_view online = absl::StripAsciiWhitespace(f[4]);
    if (online == "none") {
      t.always_online = false;
    } else if (!online.empty()) {
      t.always_online = false;
      ASSIGN_OR_RETURN(t.online, Windows(online, where + " online"));
    }
    out.push_back(std::move(t));
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": no clients (a header, then one line each)"));
  }
  return out;
}

StatusOr<std::vector<DeviceTrace>> ReadDeviceTraces(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseDeviceTraces(text, path);
}

std::string FormatDeviceTraces(const std::vector<DeviceTrace>& traces) {
  bool memory = false;
  for (const DeviceTrace& t : traces) memory = memory || t.device.memory_limit_mb > 0;
  std::string out = absl::StrCat(memory ? kMemoryHeader : kHeader, "\n");
  for (size_t i = 0; i < traces.size(); ++i) {
    const DeviceTrace& t = traces[i];
    std::string online;
    if (!t.always_online) {
      if (t.online.empty()) online = "none";
      for (const auto& [start, end] : t.online) {
        absl::StrAppend(&online, online.empty() ? "" : ";", Num(start), "-",
                        std::isinf(end) ? "" : Num(end));
      }
    }
    absl::StrAppend(&out, i, ",", Num(t.device.slowdown), ",", Num(t.device.uplink_mbps), ",",
                    Num(t.device.downlink_mbps), ",", online);
    if (memory) absl::StrAppend(&out, ",", t.device.memory_limit_mb);
    absl::StrAppend(&out, "\n");
  }
  return out;
}

StatusOr<std::vector<DeviceTrace>> GenerateDeviceTraces(const TraceSpec& s) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(what); };
  if (s.clients < 1) return bad("a trace needs at least one client");
  if (!(s.speed_spread >= 1)) return bad("the speed spread must be >= 1");
  for (auto [lo, hi] : {std::pair{s.uplink_min_mbps, s.uplink_max_mbps},
                        std::pair{s.downlink_min_mbps, s.downlink_max_mbps}}) {
    if (lo < 0 || hi < lo || (lo == 0) != (hi == 0)) {
      return bad("link speeds: MIN:MAX with 0 < MIN <= MAX Mbps, or none");
    }
  }
  if (!(s.online_fraction > 0 && s.online_fraction <= 1)) {
    return bad("the online fraction must be in (0, 1]");
  }
  if (!(s.session_s > 0) || !(s.horizon_s > 0)) return bad("session and horizon must be > 0 s");
  for (const TraceSpec::Tier& tier : s.tiers) {
    if (tier.memory_mb < 0 || !(tier.slowdown >= 1)) return bad("a tier: memory >= 0 MiB, slowdown >= 1");
  }
  std::mt19937_64 rng(s.seed);
  std::uniform_real_distribution<double> unit(0, 1);
  auto log_uniform = [&](double lo, double hi) {
    return lo == hi ? lo : std::exp(std::log(lo) + unit(rng) * (std::log(hi) - std::log(lo)));
  };
  // Rounded to 3 significant decimals so that the file reads back unchanged.
  auto round3 = [](double v) { return std::round(v * 1000) / 1000; };
  std::vector<DeviceTrace> out(s.clients);
  for (size_t i = 0; i < out.size(); ++i) {
    DeviceTrace& t = out[i];
    t.device.slowdown = round3(log_uniform(1, s.speed_spread));
    if (!s.tiers.empty()) {
      const TraceSpec::Tier& tier = s.tiers[i % s.tiers.size()];
      t.device.slowdown = round3(t.device.slowdown * tier.slowdown);
      t.device.memory_limit_mb = tier.memory_mb;
    }
    if (s.uplink_max_mbps > 0) t.device.uplink_mbps = round3(log_uniform(s.uplink_min_mbps, s.uplink_max_mbps));
    if (s.downlink_max_mbps > 0) {
      t.device.downlink_mbps = round3(log_uniform(s.downlink_min_mbps, s.downlink_max_mbps));
    }
    if (s.online_fraction >= 1) continue;
    t.always_online = false;
    std::exponential_distribution<double> on(1 / s.session_s);
    std::exponential_distribution<double> off(s.online_fraction / (s.session_s * (1 - s.online_fraction)));
    bool online = unit(rng) < s.online_fraction;
    double now = 0;
    while (now < s.horizon_s) {
      const double length = std::max(1.0, round3(online ? on(rng) : off(rng)));
      const double end = round3(now + length);
      if (online) t.online.emplace_back(now, end >= s.horizon_s ? kForever : end);
      now = end;
      online = !online;
    }
    if (t.online.empty() || !std::isinf(t.online.back().second)) {
      t.online.emplace_back(now, kForever);  // past the horizon: online for good
    }
  }
  return out;
}

StatusOr<std::vector<TraceSpec::Tier>> ParseTiers(const std::string& text) {
  std::vector<TraceSpec::Tier> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
    TraceSpec::Tier tier;
    if (parts.size() != 2 || !absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[0]), &tier.memory_mb) ||
        !absl::SimpleAtod(absl::StripAsciiWhitespace(parts[1]), &tier.slowdown) || tier.memory_mb < 0 ||
        !(tier.slowdown >= 1)) {
      return absl::InvalidArgumentError(absl::StrCat("tier '", item,
                                                     "': MEMORY_MB:SLOWDOWN, memory >= 0 MiB, slowdown >= 1"));
    }
    out.push_back(tier);
  }
  if (out.empty()) return absl::InvalidArgumentError("--tiers: at least one MEMORY_MB:SLOWDOWN");
  return out;
}

}  // namespace cleave
