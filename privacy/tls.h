// gRPC channel credentials for a federation member (cleave-client, cleave status, tests).
#pragma once

#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>

#include "core/status.h"

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

// The bearer token in file `path` (auth.token_file, --token-file), surrounding
// whitespace removed; an empty one is an error.
StatusOr<std::string> ReadBearerToken(const std::string& path);

}  // namespace cleave
