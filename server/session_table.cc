#include "server/session_table.h"

#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/printable.h"

namespace cleave {

bool TokenMatches(const std::string& expected, const std::string& given) {
  return expected.size() == given.size() &&
         CRYPTO_memcmp(expected.data(), given.data(), expected.size()) == 0;
}

Status SessionTable::Admit(const std::string& identity) const {
  if (static_cast<int>(sessions_.size()) >= max_) {
    // A device reconnecting with its certificate replaces its session: it may.
    const bool replaces =
        mutual_ && std::any_of(sessions_.begin(), sessions_.end(),
                               [&](const auto& kv) { return kv.second.identity == identity; });
    if (!replaces) {
      return absl::ResourceExhaustedError(absl::StrCat("the server holds its maximum of ", max_,
                                                       " sessions (server.max_sessions)"));
    }
  }
  if (mutual_ && Revoked(identity)) {
    spdlog::warn("refused a Join from revoked certificate '{}'", Printable(identity));
    return absl::PermissionDeniedError(
        absl::StrCat("the certificate of '", Printable(identity), "' is revoked"));
  }
  return absl::OkStatus();
}

std::string SessionTable::ReplacedBy(const std::string& identity) const {
  if (!mutual_) return "";
  for (const auto& [id, s] : sessions_) {
    if (s.identity == identity) return id;
  }
  return "";
}

std::vector<std::string> SessionTable::Ids() const {
  std::vector<std::string> ids;
  for (const auto& [id, s] : sessions_) ids.push_back(id);
  return ids;
}

Session& SessionTable::Add(Session s, const std::string& identity, const std::string& joined_as) {
  s.id = absl::StrCat("c", next_++);
  s.identity = mutual_ ? identity : "";
  s.name = !s.identity.empty() ? s.identity : joined_as.empty() ? s.id : joined_as;
  const std::string id = s.id;
  return sessions_[id] = std::move(s);
}

Session* SessionTable::Find(const std::string& id) {
  auto it = sessions_.find(id);
  return it != sessions_.end() ? &it->second : nullptr;
}

const Session* SessionTable::Find(const std::string& id) const {
  auto it = sessions_.find(id);
  return it != sessions_.end() ? &it->second : nullptr;
}

StatusOr<const Session*> SessionTable::Authenticate(const std::string& id, const std::string& token,
                                                    const std::string& peer) const {
  const Session* s = Find(id);
  if (s == nullptr || !TokenMatches(s->token, token)) {
    return absl::UnauthenticatedError("unknown client or wrong session token");
  }
  if (!peer.empty() && Revoked(peer)) return absl::PermissionDeniedError("certificate revoked");
  if (s->identity != peer) {
    return absl::PermissionDeniedError(absl::StrCat("client ", id, " joined as '", s->identity,
                                                    "'; this call's certificate is '", peer, "'"));
  }
  return s;
}

std::vector<std::string> SessionTable::Revoke(std::set<std::string> revoked) {
  for (const auto& name : revoked) {
    if (!Revoked(name)) spdlog::warn("revocation list: '{}' is revoked", Printable(name));
  }
  revoked_ = std::move(revoked);
  std::vector<std::string> ended;
  for (const auto& [id, s] : sessions_) {
    if (!s.identity.empty() && Revoked(s.identity)) ended.push_back(id);
  }
  return ended;
}

int SessionTable::Ready() const {
  int n = 0;
  for (const auto& [id, s] : sessions_) n += s.ready;
  return n;
}

std::vector<std::string> SessionTable::Available(
    const std::function<bool(const std::string& id)>& serves) const {
  std::vector<std::pair<std::string, std::string>> named;  // (name, id)
  for (const auto& [id, s] : sessions_) {
    if (s.ready && s.unfit.empty() && serves(id)) named.emplace_back(s.name, id);
  }
  const auto numeric = [](const std::string& a, const std::string& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  };
  std::sort(named.begin(), named.end(), [&](const auto& a, const auto& b) {
    return a.first != b.first ? numeric(a.first, b.first) : numeric(a.second, b.second);
  });
  std::vector<std::string> ids;
  ids.reserve(named.size());
  for (auto& [name, id] : named) ids.push_back(std::move(id));
  return ids;
}

}  // namespace cleave
