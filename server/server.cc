// The Server facade: a transport-free Coordinator behind the gRPC transport.
#include "server/server.h"

#include <malloc.h>

#include "server/coordinator.h"
#include "server/rpc.h"

namespace cleave {

// Members in this order: the transport goes first (its reactors call the core until
// its Shutdown returns), the coordinator and its worker pool after.
class Server::Impl {
 public:
  std::unique_ptr<Coordinator> core;
  std::unique_ptr<RpcTransport> rpc;
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

Status Server::Start() { return impl_->rpc->Start(); }
int Server::port() const { return impl_->rpc->port(); }
std::shared_ptr<grpc::Channel> Server::InProcessChannel() { return impl_->rpc->InProcessChannel(); }
Status Server::Run() { return impl_->core->Run(); }
void Server::Stop() { impl_->core->Stop(); }
ParameterSet Server::GlobalModel() const { return impl_->core->GlobalModel(); }
int64_t Server::committed_round() const { return impl_->core->committed_round(); }
std::vector<RoundMetrics> Server::History() const { return impl_->core->History(); }
std::pair<int64_t, int64_t> Server::TransportBytes() const { return impl_->core->TransportBytes(); }
Server::UploadCounts Server::Uploads() const { return impl_->core->Uploads(); }
StatusOr<int64_t> Server::WaitForClients() { return impl_->core->WaitForClients(); }
StatusOr<EdgeRound> Server::RunEdgeRound(const ParameterSet& start, const FitSettings& fit,
                                         uint64_t seed) {
  return impl_->core->RunEdgeRound(start, fit, seed);
}
void Server::Finish(const std::string& reason) { impl_->core->Finish(reason); }

}  // namespace cleave
