#include "server/observe/observe_http.h"

#include <spdlog/spdlog.h>

#include "server/coordinator.h"
#include "server/observe/observe.h"

namespace cleave {

StatusOr<std::unique_ptr<HttpEndpoint>> StartObserveEndpoint(Coordinator* core,
                                                             const std::string& listen,
                                                             const std::string& tls_cert,
                                                             const std::string& tls_key,
                                                             int client_series) {
  std::map<std::string, HttpEndpoint::Page> pages;
  pages["/metrics"] = {"text/plain; version=0.0.4; charset=utf-8", [core, client_series] {
                         return PrometheusText(core->Observe(/*history=*/false), client_series);
                       }};
  pages["/api/state"] = {"application/json",
                         [core] { return StateJson(core->Observe(/*history=*/true)); }};
  pages["/"] = {"text/html; charset=utf-8", [core] {
                  return DashboardHtml(StateJson(core->Observe(/*history=*/true)));
                }};
  ASSIGN_OR_RETURN(auto e, HttpEndpoint::Start("server.metrics_listen", listen, tls_cert, tls_key,
                                               "tls.cert, which this job does not set",
                                               std::move(pages)));
  spdlog::info("operator endpoint: {}://{}:{}/ (dashboard), /metrics (Prometheus)",
               e->https() ? "https" : "http", e->host(), e->port());
  return e;
}

}  // namespace cleave
