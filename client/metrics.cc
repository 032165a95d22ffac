// ClientMetricsText (client/client.h): a client's figures in Prometheus' text format.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"

namespace cleave {

namespace {

// A label value in Prometheus' text format: backslash, quote and newline escaped.
std::string LabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

void Metric(std::string* out, const char* name, const char* type, const char* help,
            const std::string& value, const std::string& labels = "") {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name,
                  labels, " ", value, "\n");
}

std::string Number(double v) { return absl::StrFormat("%.17g", v); }

}  // namespace

std::string ClientMetricsText(const ClientState& s) {
  std::string out;
  Metric(&out, "cleave_device_info", "gauge", "The run and the id the server knows this client by.",
         "1",
         absl::StrCat("{run_id=\"", LabelValue(s.run_id), "\",client_id=\"",
                      LabelValue(s.client_id), "\"}"));
  Metric(&out, "cleave_device_connected", "gauge",
         "1 while joined to a run with the control stream open.", s.connected ? "1" : "0");
  Metric(&out, "cleave_device_round", "gauge", "The round of the last task received.",
         absl::StrCat(s.round));
  Metric(&out, "cleave_device_tasks_done_total", "counter", "Tasks completed.",
         absl::StrCat(s.tasks_done));
  Metric(&out, "cleave_device_tasks_failed_total", "counter",
         "Tasks declined or failed after accepting.", absl::StrCat(s.tasks_failed));
  Metric(&out, "cleave_device_bytes_sent_total", "counter",
         "Bytes of updates, activations and models sent.", absl::StrCat(s.bytes_sent));
  Metric(&out, "cleave_device_bytes_received_total", "counter",
         "Bytes of models, gradients and peers' models received.", absl::StrCat(s.bytes_received));
  Metric(&out, "cleave_device_train_seconds", "gauge", "Duration of the last local training.",
         Number(s.train_seconds));
  Metric(&out, "cleave_device_train_loss", "gauge", "Mean loss of the last local training.",
         Number(s.train_loss));
  Metric(&out, "cleave_device_examples", "gauge", "Training examples on this device.",
         absl::StrCat(s.examples));
  Metric(&out, "cleave_device_gossip_uplink_mbps", "gauge",
         "Uplink its last gossip sends measured, Mbit/s (0: none).", Number(s.gossip_uplink_mbps));
  return out;
}

}  // namespace cleave
