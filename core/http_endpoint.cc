#include "core/http_endpoint.h"

#include <httplib.h>

#include <thread>

#include "absl/strings/str_cat.h"

namespace cleave {

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

struct HttpEndpoint::Impl {
  std::unique_ptr<httplib::Server> server;
  std::thread thread;
};

StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(const std::string& option,
                                                           const std::string& listen,
                                                           const std::string& tls_cert,
                                                           const std::string& tls_key,
                                                           const std::string& cert_source,
                                                           std::map<std::string, Page> pages) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(option, " '", listen, "': not host:port"));
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  try {
    port = std::stoi(listen.substr(colon + 1));
  } catch (...) {
    return absl::InvalidArgumentError(absl::StrCat(option, " '", listen, "': not host:port"));
  }
  std::unique_ptr<HttpEndpoint> e(new HttpEndpoint());
  e->impl_ = std::make_unique<Impl>();
  e->host_ = host;
  if (IsLoopbackHost(host)) {
    e->impl_->server = std::make_unique<httplib::Server>();
  } else {
    if (tls_cert.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          option, " ", listen, " is not a loopback address: it is served over HTTPS with ",
          cert_source, " (or listen on 127.0.0.1)"));
    }
    auto https = std::make_unique<httplib::SSLServer>(tls_cert.c_str(), tls_key.c_str());
    if (!https->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat(option, ": cannot serve HTTPS with ", tls_cert, " and ", tls_key));
    }
    e->impl_->server = std::move(https);
    e->https_ = true;
  }
  httplib::Server& s = *e->impl_->server;
  for (auto& [path, page] : pages) {
    s.Get(path, [page = std::move(page)](const httplib::Request&, httplib::Response& res) {
      res.set_content(page.render(), page.content_type);
    });
  }
  e->port_ = port == 0 ? s.bind_to_any_port(host) : (s.bind_to_port(host, port) ? port : -1);
  if (e->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat(option, ": cannot bind ", listen));
  }
  e->impl_->thread = std::thread([&s] { s.listen_after_bind(); });
  // Stopping before the loop runs would not stop it: wait until it does.
  for (int i = 0; i < 5000 && !s.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return e;
}

HttpEndpoint::~HttpEndpoint() {
  if (!impl_ || !impl_->server) return;
  impl_->server->stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace cleave
