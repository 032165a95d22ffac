// The operator's HTTP endpoint (server.metrics_listen): /metrics in Prometheus' text
// format, the dashboard at /, and its data at /api/state. Plain HTTP only on a loopback
// address; anywhere else HTTPS with the server's certificate (tls.cert, tls.key), so
// the run's figures and client names are never served in the clear off the host.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"

namespace cleave {

class Coordinator;

class ObserveEndpoint {
 public:
  // Serves on `listen` (host:port; port 0 picks one). FAILED_PRECONDITION for a
  // non-loopback address without `tls_cert`; UNAVAILABLE if it cannot bind.
  static StatusOr<std::unique_ptr<ObserveEndpoint>> Start(Coordinator* core,
                                                          const std::string& listen,
                                                          const std::string& tls_cert,
                                                          const std::string& tls_key,
                                                          int client_series);
  ~ObserveEndpoint();  // stops serving
  int port() const { return port_; }
  bool https() const { return https_; }

  struct Impl;

 private:
  ObserveEndpoint() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  bool https_ = false;
};

// Whether `host` names this machine's loopback interface.
bool IsLoopbackHost(const std::string& host);

}  // namespace cleave
