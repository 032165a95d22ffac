// gRPC channel credentials for a federation member (cleave-client, cleave status, tests).
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <set>
#include <string>

#include "core/status.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace cleave {

// TLS that verifies the server against the federation CA at `ca`, presenting the
// certificate `cert` with key `key` when given (mutual TLS). The files are re-read
// every `reload_s` seconds, so renewed certificates need no restart. A non-empty `token`
// goes with every call as "authorization: Bearer TOKEN" (gRPC sends it only over TLS).
// Plaintext when `ca` is empty.
std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(const std::string& ca,
                                                            const std::string& cert,
                                                            const std::string& key,
                                                            unsigned reload_s = 60,
                                                            const std::string& token = "");

// A client's Peer server (gossip rounds): its own certificate `cert` and key `key`,
// requiring and verifying the caller's certificate against the federation CA at `ca`
// (mutual TLS, so a caller's CN is its identity), re-read every `reload_s` seconds.
// Plaintext when `ca` is empty.
std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials(const std::string& ca,
                                                               const std::string& cert,
                                                               const std::string& key,
                                                               unsigned reload_s = 60);

// The CN of a call's verified client certificate; empty without one (no mutual TLS).
std::string PeerCommonName(const grpc::ServerContextBase& ctx);

// The server's TLS material as read from its files: what FileWatcherCertificateProvider
// is given, once CheckServerTls has accepted it.
struct TlsMaterial {
  std::string cert_chain;  // PEM
  std::string key;         // PEM
  std::string ca;          // PEM bundle; empty without tls.ca
};

// Reads and checks the server's certificate chain, private key and (optional) CA bundle:
// every file readable and PEM-parseable, the key matching the certificate. On failure
// INVALID_ARGUMENT naming the file and what is wrong with it.
StatusOr<TlsMaterial> ReadServerTls(const std::string& cert, const std::string& key,
                                    const std::string& ca);

// A revocation list (tls.revoked): one device identity (its certificate's CN) per line;
// blank lines and lines starting with '#' are ignored. `cleave certs revoke` appends to it.
StatusOr<std::set<std::string>> ReadRevocationList(const std::string& path);

// The bearer token in file `path` (auth.token_file, --token-file), surrounding
// whitespace removed; an empty one is an error.
StatusOr<std::string> ReadBearerToken(const std::string& path);

}  // namespace cleave
