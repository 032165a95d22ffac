// ClientMetricsText (client/client.h): a client's figures in Prometheus' text format.
#include "client/client.h"
#include "core/prometheus.h"

namespace cleave {

std::string ClientMetricsText(const ClientState& s) {
  using prometheus::Label;
  prometheus::Exposition e;
  e.Family("cleave_device_info", "gauge", "The run and the id the server knows this client by.");
  e.Sample("cleave_device_info", 1,
           "run_id=\"" + Label(s.run_id) + "\",client_id=\"" + Label(s.client_id) + "\"");
  e.Gauge("cleave_device_connected", "1 while joined to a run with the control stream open.",
          s.connected ? 1 : 0);
  e.Gauge("cleave_device_round", "The round of the last task received.",
          static_cast<double>(s.round));
  e.Counter("cleave_device_tasks_done_total", "Tasks completed.",
            static_cast<double>(s.tasks_done));
  e.Counter("cleave_device_tasks_failed_total", "Tasks declined or failed after accepting.",
            static_cast<double>(s.tasks_failed));
  e.Counter("cleave_device_bytes_sent_total", "Bytes of updates, activations and models sent.",
            static_cast<double>(s.bytes_sent));
  e.Counter("cleave_device_bytes_received_total",
            "Bytes of models, gradients and peers' models received.",
            static_cast<double>(s.bytes_received));
  e.Gauge("cleave_device_train_seconds", "Duration of the last local training.", s.train_seconds);
  e.Gauge("cleave_device_train_loss", "Mean loss of the last local training.", s.train_loss);
  e.Gauge("cleave_device_examples", "Training examples on this device.",
          static_cast<double>(s.examples));
  e.Gauge("cleave_device_gossip_uplink_mbps",
          "Uplink its last gossip sends measured, Mbit/s (0: none).", s.gossip_uplink_mbps);
  return e.Take();
}

}  // namespace cleave
