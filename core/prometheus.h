// Prometheus' text exposition format: the writer the server's /metrics and a client's
// /metrics (cleave-client --metrics-listen) both render with. Header-only, no I/O.
#pragma once

#include <charconv>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace cleave::prometheus {

// A label value as the exposition format quotes it.
inline std::string Label(const std::string& v) {
  return absl::StrReplaceAll(v, {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

// The shortest text that reads back as `v` (Prometheus parses Go's float syntax).
inline std::string Num(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

class Exposition {
 public:
  // Starts a metric family.
  void Family(const std::string& name, const char* type, const char* help) {
    absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  }
  // `labels`: name="value" pairs, comma-separated, values quoted with Label().
  void Sample(const std::string& name, double v, const std::string& labels = "") {
    absl::StrAppend(&out_, name, labels.empty() ? "" : "{" + labels + "}", " ", Num(v), "\n");
  }
  void Gauge(const std::string& name, const char* help, double v) {
    Family(name, "gauge", help);
    Sample(name, v);
  }
  void Counter(const std::string& name, const char* help, double v) {
    Family(name, "counter", help);
    Sample(name, v);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace cleave::prometheus
