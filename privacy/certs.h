// A federation's TLS identities (issue 5): a root CA, the server's certificate and one
// certificate per client whose identity (subject CN) is the client's name. ECDSA P-256
// keys and SHA-256 signatures (OpenSSL 3); private keys are written 0600.
//
// Layout of a federation directory:
//   ca.crt, ca.key                  the root (CA:TRUE, keyCertSign), valid 5 years
//   server.crt, server.key          serverAuth, the SANs given, valid 397 days
//   clients/NAME.crt, NAME.key      clientAuth, CN = NAME, valid 397 days
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace cleave {

struct CertOptions {
  std::string federation = "cleave";  // in the CA's subject
  // The server certificate's subject alternative names: host names and IP addresses.
  std::vector<std::string> server_names = {"localhost", "127.0.0.1", "::1"};
  int ca_days = 5 * 365;
  int leaf_days = 397;
};

// Creates `dir` (if needed) with a new CA and server certificate. ALREADY_EXISTS if
// `dir` already holds a CA: a federation's root is never silently replaced.
Status InitFederation(const std::string& dir, const CertOptions& options = {});

// The name a client's certificate carries as a server (its subjectAltName): NAME plus
// this suffix. In gossip rounds a client serves Peer and its neighbours verify it under
// that name; the suffix keeps peer names apart from any coordinator's hostname, so a
// client certificate can never pass for the coordinator's.
inline constexpr char kPeerNameSuffix[] = ".peer.cleave";

// Issues a client certificate for `name` (1-64 of [A-Za-z0-9._-]) signed by `dir`'s CA.
// ALREADY_EXISTS if that client already has one.
Status IssueClientCert(const std::string& dir, const std::string& name,
                       const CertOptions& options = {});

// Revokes `name`'s identity: appends it to `dir`/revoked.txt (the file tls.revoked
// names; the server re-reads it every tls.reload_s and ends the device's live session).
// A revoked name stays revoked: a replacement device needs a new name. INVALID_ARGUMENT
// for a name no certificate could have; OK if it is already revoked.
Status RevokeClient(const std::string& dir, const std::string& name);

// The names a client may use: 1-64 characters of [A-Za-z0-9._-], not starting with '.'.
bool ValidClientName(const std::string& name);

}  // namespace cleave
