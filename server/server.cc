// The Server facade: a transport-free Coordinator behind the gRPC transport.
#include "server/server.h"

#include <malloc.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "server/coordinator.h"
#include "server/observe/observe_http.h"
#include "server/transport/rpc.h"

namespace cleave {

// Members in this order: the operator's endpoint and the transport go first (they call
// the core until they stop), the coordinator and its worker pool after.
class Server::Impl {
 public:
  std::unique_ptr<Coordinator> core;
  std::unique_ptr<RpcTransport> rpc;
  std::unique_ptr<HttpEndpoint> observe;  // server.metrics_listen
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  impl_->core->Stop();
  impl_->rpc->Shutdown();
}

StatusOr<std::unique_ptr<Server>> Server::Create(ServerOptions options) {
  // Upload payloads and model encodings are MBs, allocated and freed every round on
  // several threads. glibc raises its mmap threshold after each large free, so without
  // a fixed one such buffers move into per-thread arenas that keep the memory: peak RSS
  // then depends on which thread freed what (bench_server_memory --codec int8: 3.8-4.5x
  // the model, 3.7x with this).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  if (!options.config.server.evaluate) options.evaluate = false;  // no test set on the server
  if (options.config.scheduler.gossip() && !options.insecure && !options.in_process_only &&
      !options.config.tls.mutual) {
    return absl::InvalidArgumentError(
        "scheduler.mode: gossip over TLS needs tls.mutual: true (neighbours verify each "
        "other by their client certificates)");
  }
  auto impl = std::make_unique<Impl>();
  impl->core = std::make_unique<Coordinator>(std::move(options));
  ASSIGN_OR_RETURN(impl->rpc, RpcTransport::Create(impl->core.get()));
  RETURN_IF_ERROR(impl->core->Init());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Status Server::Start() {
  RETURN_IF_ERROR(impl_->rpc->Start());
  const ServerOptions& o = impl_->core->options();
  const ServerConfig& c = o.config.server;
  if (c.metrics_listen.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(impl_->observe,
                   StartObserveEndpoint(impl_->core.get(), c.metrics_listen, o.config.tls.cert,
                                        o.config.tls.key, c.metrics_client_series));
  if (o.run_dir.empty()) return absl::OkStatus();
  // Where to find it, as server.addr says where the clients' port is.
  const std::string host = c.metrics_listen.substr(0, c.metrics_listen.rfind(':'));
  return WriteFileAtomic((std::filesystem::path(o.run_dir) / "metrics.addr").string(),
                         absl::StrCat(impl_->observe->https() ? "https://" : "http://",
                                      host == "0.0.0.0" ? "127.0.0.1" : host, ":",
                                      impl_->observe->port(), "\n"));
}

int Server::metrics_port() const { return impl_->observe ? impl_->observe->port() : 0; }
int Server::port() const { return impl_->rpc->port(); }
std::shared_ptr<grpc::Channel> Server::InProcessChannel() { return impl_->rpc->InProcessChannel(); }
Status Server::Run() { return impl_->core->Run(); }
void Server::Stop() { impl_->core->Stop(); }
ParameterSet Server::GlobalModel() const { return impl_->core->GlobalModel(); }
int64_t Server::committed_round() const { return impl_->core->committed_round(); }
std::vector<RoundMetrics> Server::History() const { return impl_->core->History(); }
std::map<std::string, double> Server::ClientTaskSeconds() const { return impl_->core->ClientTaskSeconds(); }
std::pair<int64_t, int64_t> Server::TransportBytes() const { return impl_->core->TransportBytes(); }
Server::UploadCounts Server::Uploads() const { return impl_->core->Uploads(); }
StatusOr<int64_t> Server::WaitForClients() { return impl_->core->WaitForClients(); }
StatusOr<EdgeRound> Server::RunEdgeRound(const ParameterSet& start, const FitSettings& fit,
                                         uint64_t seed) {
  return impl_->core->RunEdgeRound(start, fit, seed);
}
void Server::Finish(const std::string& reason) { impl_->core->Finish(reason); }

}  // namespace cleave
