#include "server/observe_http.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "server/coordinator.h"
#include "server/observe.h"

namespace cleave {

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

struct ObserveEndpoint::Impl {
  std::unique_ptr<httplib::Server> server;
  std::thread thread;
};

StatusOr<std::unique_ptr<ObserveEndpoint>> ObserveEndpoint::Start(Coordinator* core,
                                                                 const std::string& listen,
                                                                 const std::string& tls_cert,
                                                                 const std::string& tls_key,
                                                                 int client_series) {
  const size_t colon = listen.rfind(':');
  std::string host = listen.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  try {
    port = std::stoi(listen.substr(colon + 1));
  } catch (...) {
    return absl::InvalidArgumentError(absl::StrCat("server.metrics_listen '", listen,
                                                   "': not host:port"));
  }
  std::unique_ptr<ObserveEndpoint> e(new ObserveEndpoint());
  e->impl_ = std::make_unique<Impl>();
  if (IsLoopbackHost(host)) {
    e->impl_->server = std::make_unique<httplib::Server>();
  } else {
    if (tls_cert.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "server.metrics_listen ", listen, " is not a loopback address: it is served over "
          "HTTPS with tls.cert, which this job does not set (or listen on 127.0.0.1)"));
    }
    auto https = std::make_unique<httplib::SSLServer>(tls_cert.c_str(), tls_key.c_str());
    if (!https->is_valid()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server.metrics_listen: cannot serve HTTPS with ", tls_cert, " and ", tls_key));
    }
    e->impl_->server = std::move(https);
    e->https_ = true;
  }
  httplib::Server& s = *e->impl_->server;
  s.Get("/metrics", [core, client_series](const httplib::Request&, httplib::Response& res) {
    res.set_content(PrometheusText(core->Observe(/*history=*/false), client_series),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Get("/api/state", [core](const httplib::Request&, httplib::Response& res) {
    res.set_content(StateJson(core->Observe(/*history=*/true)), "application/json");
  });
  s.Get("/", [core](const httplib::Request&, httplib::Response& res) {
    res.set_content(DashboardHtml(StateJson(core->Observe(/*history=*/true))),
                    "text/html; charset=utf-8");
  });
  e->port_ = port == 0 ? s.bind_to_any_port(host) : (s.bind_to_port(host, port) ? port : -1);
  if (e->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("server.metrics_listen: cannot bind ", listen));
  }
  e->impl_->thread = std::thread([&s] { s.listen_after_bind(); });
  // Stopping before the loop runs would not stop it: wait until it does.
  for (int i = 0; i < 5000 && !s.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  spdlog::info("operator endpoint: {}://{}:{}/ (dashboard), /metrics (Prometheus)",
               e->https_ ? "https" : "http", host, e->port_);
  return e;
}

ObserveEndpoint::~ObserveEndpoint() {
  if (!impl_ || !impl_->server) return;
  impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace cleave
