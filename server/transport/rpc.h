// The coordinator's gRPC transport: the service's reactors, which translate messages
// into Coordinator calls (server/coordinator.h), the listening port with its limits,
// TLS (checked and staged material, reloads, revocation lists) and bearer tokens.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "core/mutex.h"
#include "core/status.h"
#include "privacy/tls.h"
#include "server/server.h"

namespace grpc {
class Channel;
class Server;
class ServerCredentials;
}  // namespace grpc

namespace cleave {

class Coordinator;
class RpcService;

class RpcTransport {
 public:
  // Checks the transport's settings in core->options(): TLS (required unless insecure)
  // and auth.token_file. `core` outlives the transport.
  static StatusOr<std::unique_ptr<RpcTransport>> Create(Coordinator* core);
  // Shutdown().
  ~RpcTransport();

  // Binds (port 0 picks a free one) and serves; writes run_dir/server.addr.
  Status Start();
  int port() const { return port_; }
  // A channel to this server that uses no socket (in-process clients). After Start().
  std::shared_ptr<grpc::Channel> InProcessChannel();
  // Stops TLS reloads and serving: calls still open are cancelled after a grace period,
  // and every reactor has finished when it returns.
  void Shutdown();

 private:
  explicit RpcTransport(Coordinator* core);
  // The port's credentials: plaintext (--insecure) or TLS from the staged material.
  StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials();
  // TLS: copies checked material into tls_dir_ (a new version directory behind the
  // symlink tls_dir_/current, so that gRPC's file watcher reads key and certificate as
  // one consistent pair).
  Status StageTls(const TlsMaterial& m);
  // Every tls.reload_s: re-checks the TLS files (a bad one is logged and the current
  // material kept) and re-reads tls.revoked, ending the sessions of revoked identities.
  void ReloadTlsLoop();

  Coordinator* const core_;
  const ServerOptions& opts_;
  const FederationConfig& cfg_;
  std::unique_ptr<RpcService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  int port_ = 0;
  // TLS staging (see StageTls); owned by Start and then the reload thread.
  std::string tls_dir_;
  int tls_version_ = 0;
  TlsMaterial tls_material_;
  std::thread tls_thread_;
  Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace cleave
