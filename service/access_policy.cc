#include "service/access_policy.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "core/parameter_set.h"
#include "core/printable.h"
#include "server/session_table.h"
#include "service/yaml_error.h"

namespace cleave {
namespace {

constexpr std::pair<const char*, Right> kRights[] = {
    {"submit", Right::kSubmit}, {"read", Right::kRead}, {"cancel", Right::kCancel}, {"admin", Right::kAdmin}};

}  // namespace

const char* RightName(Right r) {
  for (const auto& [name, right] : kRights) {
    if (right == r) return name;
  }
  return "?";
}

StatusOr<AccessPolicy> AccessPolicy::Parse(const std::string& yaml, const std::string& name) {
  YAML::Node doc;
  try {
    doc = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return FileLineError(name, e.mark.line, "not YAML: " + e.msg);
  }
  if (!doc.IsMap()) return absl::InvalidArgumentError(absl::StrCat(name, ": a policy is a map (identities, tokens)"));
  AccessPolicy p;
  for (const auto& entry : doc) {
    const std::string key = entry.first.as<std::string>("");
    if (key != "identities" && key != "tokens") {
      return At(name, entry.first, absl::StrCat("unknown key ", Printable(key), " (identities, tokens)"));
    }
    if (!entry.second.IsMap() && !entry.second.IsNull()) return At(name, entry.second, key + " is a map");
  }
  for (const auto& id : doc["identities"]) {
    const std::string identity = id.first.as<std::string>("");
    if (identity.empty()) return At(name, id.first, "an empty identity");
    if (!id.second.IsSequence()) return At(name, id.second, identity + ": a list of rights");
    std::set<Right>& rights = p.rights_[identity];
    for (const auto& r : id.second) {
      const std::string right = r.as<std::string>("");
      bool known = false;
      for (const auto& [n, value] : kRights) {
        if (right == n) rights.insert(value), known = true;
      }
      if (!known) return At(name, r, absl::StrCat("unknown right ", Printable(right), " (submit, read, cancel, admin)"));
    }
  }
  for (const auto& t : doc["tokens"]) {
    const std::string hash = absl::AsciiStrToLower(t.first.as<std::string>(""));
    if (hash.size() != 64 || hash.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return At(name, t.first, "a token is named by its SHA-256, 64 hex digits (sha256sum TOKEN_FILE)");
    }
    const std::string identity = t.second.as<std::string>("");
    if (identity.empty()) return At(name, t.second, "a token's identity is empty");
    p.tokens_[hash] = identity;
  }
  return p;
}

StatusOr<AccessPolicy> AccessPolicy::Load(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  return Parse(text, path);
}

bool AccessPolicy::Has(const std::string& identity, Right right) const {
  auto it = rights_.find(identity);
  if (it == rights_.end()) return false;
  return it->second.count(right) > 0 || it->second.count(Right::kAdmin) > 0;
}

std::string AccessPolicy::IdentityOfToken(const std::string& token) const {
  if (token.empty()) return "";
  const std::string hash = Sha256Hex(token);
  std::string found;
  for (const auto& [h, identity] : tokens_) {  // every entry compared: the time tells nothing
    if (TokenMatches(h, hash)) found = identity;
  }
  return found;
}

StatusOr<std::unique_ptr<PolicyFile>> PolicyFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(AccessPolicy policy, AccessPolicy::Load(path));
  return std::unique_ptr<PolicyFile>(new PolicyFile(path, std::move(policy)));
}

PolicyFile::PolicyFile(std::string path, AccessPolicy policy) : path_(std::move(path)) {
  MutexLock l(&mu_);
  policy_ = std::make_shared<const AccessPolicy>(std::move(policy));
  stamp_ = Stamp();
}

std::string PolicyFile::Stamp() const {
  struct stat st {};
  if (stat(path_.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec, ":", st.st_size);
}

std::shared_ptr<const AccessPolicy> PolicyFile::Current() {
  MutexLock l(&mu_);
  const std::string stamp = Stamp();
  if (stamp == stamp_) return policy_;
  stamp_ = stamp;
  StatusOr<AccessPolicy> next = AccessPolicy::Load(path_);
  if (!next.ok()) {
    spdlog::error("policy {} changed but is refused, the last one stays: {}", path_, next.status().ToString());
    return policy_;
  }
  spdlog::info("policy {} reloaded", path_);
  policy_ = std::make_shared<const AccessPolicy>(*std::move(next));
  return policy_;
}

}  // namespace cleave
