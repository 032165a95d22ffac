// The operator's HTTP endpoint (server.metrics_listen): /metrics in Prometheus' text
// format, the dashboard at /, and its data at /api/state. Plain HTTP only on a loopback
// address; anywhere else HTTPS with the server's certificate (tls.cert, tls.key), so
// the run's figures and client names are never served in the clear off the host
// (core/http_endpoint.h).
#pragma once

#include <memory>
#include <string>

#include "core/http_endpoint.h"
#include "core/status.h"

namespace cleave {

class Coordinator;

// Serves `core`'s figures on `listen` (host:port; port 0 picks one); errors as
// HttpEndpoint::Start's.
StatusOr<std::unique_ptr<HttpEndpoint>> StartObserveEndpoint(Coordinator* core,
                                                             const std::string& listen,
                                                             const std::string& tls_cert,
                                                             const std::string& tls_key,
                                                             int client_series);

}  // namespace cleave
