// SessionTable: the connected clients' sessions, one of the coordinator's components:
// who may join (server.max_sessions, revoked certificates, one session per certificate
// under mutual TLS), the ids they are given, who a call's token and certificate say
// it is, and the order sampling draws from. Not thread-safe: the coordinator's mutex
// guards it. Ending a session (its tasks, the drivers' state of it) is the coordinator's.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"
#include "server/rounds/round_state.h"

namespace cleave {

// Constant-time comparison, so response timing does not leak a token byte by byte.
bool TokenMatches(const std::string& expected, const std::string& given);

class SessionTable {
 public:
  using Map = std::map<std::string, Session>;

  // `mutual`: clients present certificates (tls.mutual), whose names are identities.
  explicit SessionTable(bool mutual) : mutual_(mutual) {}

  // server.max_sessions, or what the descriptor limit allows.
  void set_max(int max) { max_ = max; }
  int max() const { return max_; }

  // Whether a Join under certificate `identity` ("" without mutual TLS) may open a
  // session: RESOURCE_EXHAUSTED at the limit, unless it replaces its own certificate's
  // session; PERMISSION_DENIED for a revoked certificate.
  Status Admit(const std::string& identity) const;
  // The id of the session a new connection of `identity` replaces (mutual TLS: one per
  // certificate); "" if none.
  std::string ReplacedBy(const std::string& identity) const;
  // Adds `s` under a new id ("c1", "c2", ... in join order), with its identity set
  // (mutual TLS) and its name defaulting to the identity, else to the id.
  Session& Add(Session s, const std::string& identity, const std::string& joined_as);

  Session* Find(const std::string& id);
  const Session* Find(const std::string& id) const;
  void Remove(const std::string& id) { sessions_.erase(id); }
  // Session `id` if `token` is its token: UNAUTHENTICATED otherwise; PERMISSION_DENIED
  // when `peer` (the call's certificate) is revoked or not the one it joined with.
  StatusOr<const Session*> Authenticate(const std::string& id, const std::string& token,
                                        const std::string& peer) const;

  // tls.revoked: the certificates refused from now on. Returns the sessions of
  // certificates it revokes, which the caller ends; logs the newly revoked ones.
  std::vector<std::string> Revoke(std::set<std::string> revoked);
  bool Revoked(const std::string& identity) const { return revoked_.count(identity) > 0; }

  // Sessions whose Welcome is queued (tasks may follow it).
  int Ready() const;
  // The ready sessions without a memory refusal that `serves` accepts, as sampling draws
  // from them: by name (numerically: sim-2 before sim-10), then by id among one name's,
  // so a seeded run samples the same clients however their connections raced.
  std::vector<std::string> Available(
      const std::function<bool(const std::string& id)>& serves) const;

  Map::iterator begin() { return sessions_.begin(); }
  Map::iterator end() { return sessions_.end(); }
  // Every session's id (to end some while going through them).
  std::vector<std::string> Ids() const;
  Map::const_iterator begin() const { return sessions_.begin(); }
  Map::const_iterator end() const { return sessions_.end(); }
  size_t size() const { return sessions_.size(); }
  bool empty() const { return sessions_.empty(); }

 private:
  const bool mutual_;
  Map sessions_;
  std::set<std::string> revoked_;
  int max_ = 0;
  int64_t next_ = 1;
};

}  // namespace cleave
