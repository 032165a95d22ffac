// An operator's HTTP endpoint (cpp-httplib): the server's /metrics and dashboard
// (server.metrics_listen), a client's /metrics (cleave-client --metrics-listen). Plain
// HTTP only on a loopback address; anywhere else HTTPS with the process's own TLS
// certificate, so a run's figures and names are never served in the clear off the host.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "core/status.h"

namespace cleave {

// Whether `host` names this machine's loopback interface.
bool IsLoopbackHost(const std::string& host);

class HttpEndpoint {
 public:
  struct Page {
    std::string content_type;
    std::function<std::string()> render;  // called per request, on the endpoint's thread
  };

  // Serves `pages` (by path) on `listen` (host:port; port 0 picks one). `option` names the
  // setting in errors and logs; `cert_source` says where a certificate comes from.
  // INVALID_ARGUMENT for a malformed address or unusable certificate, FAILED_PRECONDITION
  // for a non-loopback address without `tls_cert`, UNAVAILABLE if it cannot bind.
  static StatusOr<std::unique_ptr<HttpEndpoint>> Start(const std::string& option,
                                                      const std::string& listen,
                                                      const std::string& tls_cert,
                                                      const std::string& tls_key,
                                                      const std::string& cert_source,
                                                      std::map<std::string, Page> pages);
  ~HttpEndpoint();  // stops serving
  int port() const { return port_; }
  bool https() const { return https_; }
  const std::string& host() const { return host_; }

  struct Impl;

 private:
  HttpEndpoint() = default;
  std::unique_ptr<Impl> impl_;
  std::string host_;
  int port_ = 0;
  bool https_ = false;
};

}  // namespace cleave
