// Who may do what with a daemon's jobs (cleave-server --daemon --policy FILE): rights
// per identity, read from a YAML file that the daemon re-reads when it changes.
//
//   identities:            # an identity: a client certificate's CN, or a token's name
//     alice: [submit]      # submit jobs; read and cancel one's own
//     carol: [read]        # read every job (list, status, logs, download)
//     dave: [cancel]       # cancel any job
//     ops: [admin]         # all of the above
//   tokens:                # bearer tokens: a token's SHA-256 (hex) and its identity
//     5e8848...42d8: alice
//
// An identity the file does not name has no right. A file that does not parse is refused
// naming its line; a running daemon keeps the last policy that did.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>

#include "core/mutex.h"
#include "core/status.h"

namespace cleave {

enum class Right { kSubmit, kRead, kCancel, kAdmin };

// "submit", "read", "cancel", "admin".
const char* RightName(Right r);

class AccessPolicy {
 public:
  // The policy in `yaml`; `name` (the file's path) prefixes its errors.
  static StatusOr<AccessPolicy> Parse(const std::string& yaml, const std::string& name);
  static StatusOr<AccessPolicy> Load(const std::string& path);

  // Whether `identity` holds `right` (admin holds every right).
  bool Has(const std::string& identity, Right right) const;
  // The identity a bearer token stands for; empty when the policy names no such token.
  // Compared by SHA-256 in constant time.
  std::string IdentityOfToken(const std::string& token) const;

 private:
  std::map<std::string, std::set<Right>> rights_;
  std::map<std::string, std::string> tokens_;  // SHA-256 hex -> identity
};

// The policy file, re-read when its modification time or size changes (a stat on each
// use). A change that does not parse is logged and ignored: the last
// policy that parsed stays.
class PolicyFile {
 public:
  // The file as it is now; its error if it does not parse.
  static StatusOr<std::unique_ptr<PolicyFile>> Open(const std::string& path);

  std::shared_ptr<const AccessPolicy> Current() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  PolicyFile(std::string path, AccessPolicy policy);
  std::string Stamp() const;

  const std::string path_;
  Mutex mu_;
  std::shared_ptr<const AccessPolicy> policy_ ABSL_GUARDED_BY(mu_);
  std::string stamp_ ABSL_GUARDED_BY(mu_);  // mtime and size it was read at
};

}  // namespace cleave
