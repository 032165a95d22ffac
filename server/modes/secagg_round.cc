#include "server/modes/secagg_round.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"

namespace cleave {
namespace {

constexpr size_t kKeyBytes = 32;
// Shamir shares of a 32-byte secret: one field element per 7-byte chunk.
constexpr int kShareElements = (32 + 6) / 7;
// AES-GCM sealed shares: nonce, two shares (x, count, elements), tag.
constexpr size_t kSealedBytes = 12 + 2 * (8 + 8 * kShareElements) + 16;

template <class Set>
int CountIn(const std::set<int>& a, const Set& b) {
  int n = 0;
  for (int v : a) n += b.count(v) > 0;
  return n;
}

Status Abort(const std::string& why) { return absl::AbortedError("secure aggregation: " + why); }

}  // namespace

SecAggRound::SecAggRound(const SecureAggregationConfig& config, std::string context,
                         std::vector<std::string> clients, int64_t length, int64_t max_weight,
                         uint64_t graph_seed)
    : config_(config),
      clients_(std::move(clients)),
      length_(length),
      max_weight_(max_weight),
      graph_seed_(graph_seed) {
  params_.k = config.k;
  params_.t = config.t;
  params_.clip = config.clip;
  params_.bits = config.bits;
  params_.modulus = config.modulus;
  params_.context = std::move(context);
  for (int i = 0; i < static_cast<int>(clients_.size()); ++i) {
    index_[clients_[i]] = i;
    u0_.insert(i);
  }
  graph_.resize(clients_.size());
  masked_with_.resize(clients_.size());
}

const char* SecAggRound::StageName(Stage s) {
  switch (s) {
    case Stage::kKeys: return "keys";
    case Stage::kShares: return "shares";
    case Stage::kMasked: return "masked input";
    case Stage::kUnmask: return "unmasking";
    case Stage::kDone: return "done";
  }
  return "?";
}

v1::SecAggTask SecAggRound::TaskMessage() const {
  v1::SecAggTask t;
  t.set_k(config_.k);
  t.set_t(config_.t);
  t.set_clip(config_.clip);
  t.set_bits(config_.bits);
  t.set_modulus(config_.modulus);
  t.set_max_weight(max_weight_);
  return t;
}

Status SecAggRound::SetSlices(const std::map<std::string, std::shared_ptr<const SecAggSlice>>& slices) {
  if (stage_ != Stage::kKeys) return absl::FailedPreconditionError("slices are set before the keys stage closes");
  std::vector<std::shared_ptr<const SecAggSlice>> by_index(clients_.size());
  for (size_t u = 0; u < clients_.size(); ++u) {
    auto it = slices.find(clients_[u]);
    if (it == slices.end() || !it->second || !it->second->positions) {
      return absl::InvalidArgumentError(absl::StrCat("client ", clients_[u], " has no slice"));
    }
    for (int64_t p : *it->second->positions) {
      if (p < 0 || p >= length_) {
        return absl::InvalidArgumentError(absl::StrCat("client ", clients_[u], "'s slice holds position ", p,
                                                       " of ", length_));
      }
    }
    by_index[u] = it->second;
  }
  slices_ = std::move(by_index);
  return absl::OkStatus();
}

int64_t SecAggRound::PayloadSize(const std::string& client) const {
  auto it = index_.find(client);
  const int64_t n = it == index_.end() ? length_ : InputLength(it->second);
  return n * ValueBytes();
}

std::set<int> SecAggRound::Alive(const std::set<int>& members) const {
  std::set<int> out;
  for (int u : members) {
    if (!dropped_.count(u)) out.insert(u);
  }
  return out;
}

StatusOr<int> SecAggRound::InStage(const std::string& client, Stage stage,
                                   const std::set<int>& members) const {
  auto it = index_.find(client);
  if (it == index_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("client ", client, " is not in this round's secure aggregation"));
  }
  if (stage_ != stage) {
    return absl::FailedPreconditionError(absl::StrCat(
        "secure aggregation is at stage '", StageName(stage_), "', not '", StageName(stage), "'"));
  }
  if (!members.count(it->second) || dropped_.count(it->second)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "client ", client, " is no longer in stage '", StageName(stage), "'"));
  }
  return it->second;
}

Status SecAggRound::AddKeys(const std::string& client, const v1::SecAggKeys& keys) {
  ASSIGN_OR_RETURN(int u, InStage(client, Stage::kKeys, u0_));
  if (u1_.count(u)) return absl::AlreadyExistsError("keys already received this round");
  if (keys.mask_public_key().size() != kKeyBytes || keys.enc_public_key().size() != kKeyBytes) {
    return absl::InvalidArgumentError("public keys must be 32 bytes (X25519)");
  }
  if (keys.mask_public_key() == keys.enc_public_key()) {
    return absl::InvalidArgumentError("the mask and encryption keys must differ");
  }
  for (const auto& [v, other] : keys_) {
    if (other.mask_public_key() == keys.mask_public_key() ||
        other.enc_public_key() == keys.enc_public_key()) {
      return absl::InvalidArgumentError("public key already used by another client");
    }
  }
  keys_[u] = keys;
  u1_.insert(u);
  return absl::OkStatus();
}

Status SecAggRound::AddShares(const std::string& client, const v1::SecAggShares& shares) {
  ASSIGN_OR_RETURN(int u, InStage(client, Stage::kShares, u1_));
  if (u2_.count(u)) return absl::AlreadyExistsError("shares already received this round");
  std::set<int> to;
  for (const auto& c : shares.shares()) {
    if (c.from() != u) {
      return absl::InvalidArgumentError(absl::StrCat("a share claims to be from ", c.from(),
                                                     "; this client is ", u));
    }
    if (!graph_[u].count(c.to())) {
      return absl::InvalidArgumentError(absl::StrCat("share for ", c.to(), ", not a neighbour"));
    }
    if (!to.insert(c.to()).second) {
      return absl::InvalidArgumentError(absl::StrCat("two shares for ", c.to()));
    }
    if (c.sealed().size() != kSealedBytes) {
      return absl::InvalidArgumentError(absl::StrCat("sealed shares of ", c.sealed().size(),
                                                     " bytes; expected ", kSealedBytes));
    }
  }
  if (to != graph_[u]) {
    return absl::InvalidArgumentError(absl::StrCat("shares for ", to.size(), " of ",
                                                   graph_[u].size(), " neighbours"));
  }
  for (const auto& c : shares.shares()) inbox_[c.to()].push_back(c);
  u2_.insert(u);
  return absl::OkStatus();
}

Status SecAggRound::AddMasked(const std::string& client, const std::string& payload) {
  ASSIGN_OR_RETURN(int u, InStage(client, Stage::kMasked, u2_));
  if (u3_.count(u)) return absl::AlreadyExistsError("masked input already received this round");
  const int64_t size = PayloadSize(client), n = InputLength(u);
  if (static_cast<int64_t>(payload.size()) != size) {
    return absl::InvalidArgumentError(absl::StrCat("masked input of ", payload.size(),
                                                   " bytes; expected ", size));
  }
  const int width = ValueBytes();
  std::vector<uint64_t> y(n);
  const auto* p = reinterpret_cast<const unsigned char*>(payload.data());
  for (int64_t i = 0; i < n; ++i, p += width) {
    uint64_t v = 0;
    for (int b = 0; b < width; ++b) v |= uint64_t{p[b]} << (8 * b);
    if (v >= config_.modulus) {
      return absl::InvalidArgumentError(
          absl::StrCat("masked value ", i, " is ", v, ", outside Z_", config_.modulus));
    }
    y[i] = v;
  }
  if (masked_sum_.empty()) masked_sum_.assign(length_, 0);
  if (slices_.empty()) {
    secagg::AddMod(masked_sum_, y, config_.modulus);
  } else {
    secagg::AddMod(masked_sum_, y, *slices_[u]->positions, config_.modulus);
  }
  u3_.insert(u);
  return absl::OkStatus();
}

Status SecAggRound::AddReveal(const std::string& client, const v1::SecAggReveal& reveal) {
  ASSIGN_OR_RETURN(int u, InStage(client, Stage::kUnmask, u3_));
  if (u4_.count(u)) return absl::AlreadyExistsError("shares already revealed this round");
  const std::set<int>& survivors = asked_survivors_[u];
  const std::set<int>& dropped = asked_dropped_[u];
  // Exactly what was asked: one share per listed neighbour, of the kind asked for.
  auto check = [&](const auto& shares, const std::set<int>& expected, const char* kind) -> Status {
    std::set<int> owners;
    for (const auto& s : shares) {
      if (!expected.count(s.owner()) || !owners.insert(s.owner()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(kind, " share of ", s.owner(), " was not asked for (or repeated)"));
      }
      // x: the holder's place among the owner's neighbours (1-based).
      if (s.y_size() != kShareElements || s.x() < 1 || s.x() > graph_[s.owner()].size()) {
        return absl::InvalidArgumentError(absl::StrCat("malformed ", kind, " share of ", s.owner()));
      }
      for (uint64_t y : s.y()) {
        if (y >= crypto::kShamirPrime) {
          return absl::InvalidArgumentError(absl::StrCat(kind, " share outside the field"));
        }
      }
      if (share_xs_[s.owner()].count(s.x())) {
        return absl::InvalidArgumentError(
            absl::StrCat(kind, " share of ", s.owner(), " repeats x = ", s.x()));
      }
    }
    if (owners != expected) {
      return absl::InvalidArgumentError(absl::StrCat(owners.size(), " ", kind, " shares; ",
                                                     expected.size(), " were asked for"));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(check(reveal.self_seed(), survivors, "self-seed"));
  RETURN_IF_ERROR(check(reveal.mask_key(), dropped, "mask-key"));
  auto store = [&](const auto& shares, auto& into) {
    for (const auto& s : shares) {
      crypto::Share sh;
      sh.x = s.x();
      sh.y.assign(s.y().begin(), s.y().end());
      into[s.owner()].push_back(std::move(sh));
      share_xs_[s.owner()].insert(s.x());
    }
  };
  store(reveal.self_seed(), self_seed_shares_);
  store(reveal.mask_key(), mask_key_shares_);
  u4_.insert(u);
  return absl::OkStatus();
}

void SecAggRound::Drop(const std::string& client) {
  auto it = index_.find(client);
  if (it != index_.end()) dropped_.insert(it->second);
}

bool SecAggRound::StageComplete() const {
  auto all_in = [&](const std::set<int>& members, const std::set<int>& answered) {
    for (int u : Alive(members)) {
      if (!answered.count(u)) return false;
    }
    return true;
  };
  switch (stage_) {
    case Stage::kKeys: return all_in(u0_, u1_);
    case Stage::kShares: return all_in(u1_, u2_);
    case Stage::kMasked: return all_in(u2_, u3_);
    case Stage::kUnmask: return all_in(u3_, u4_);
    case Stage::kDone: return true;
  }
  return true;
}

StatusOr<std::map<std::string, v1::ServerMessage>> SecAggRound::CloseStage() {
  switch (stage_) {
    case Stage::kKeys: return CloseKeys();
    case Stage::kShares: return CloseShares();
    case Stage::kMasked: return CloseMasked();
    case Stage::kUnmask:
      stage_ = Stage::kDone;
      return std::map<std::string, v1::ServerMessage>{};
    case Stage::kDone: break;
  }
  return absl::FailedPreconditionError("secure aggregation already done");
}

StatusOr<std::map<std::string, v1::ServerMessage>> SecAggRound::CloseKeys() {
  const std::set<int> u1 = Alive(u1_);
  u1_ = u1;
  const int n = static_cast<int>(u1.size());
  if (n <= config_.t) {
    stage_ = Stage::kDone;
    return Abort(absl::StrCat(n, " clients sent keys; more than t = ", config_.t, " are needed"));
  }
  // The graph on U1's members, through a compact numbering.
  const std::vector<int> members(u1.begin(), u1.end());
  const auto compact = secagg::NeighbourGraph(n, config_.k, graph_seed_);
  for (int i = 0; i < n; ++i) {
    for (int j : compact[i]) graph_[members[i]].insert(members[j]);
  }
  if (!slices_.empty()) AddHoldingNeighbours(members);
  for (int u : members) {
    if (static_cast<int>(graph_[u].size()) < config_.t) {
      stage_ = Stage::kDone;
      return Abort(absl::StrCat("client ", u, " has ", graph_[u].size(),
                                " neighbours, fewer than t = ", config_.t));
    }
  }
  std::map<std::string, v1::ServerMessage> out;
  for (int u : members) {
    auto* m = out[clients_[u]].mutable_secagg_neighbours();
    m->set_index(u);
    for (int v : graph_[u]) {
      auto* p = m->add_peers();
      p->set_index(v);
      p->set_mask_public_key(keys_[v].mask_public_key());
      p->set_enc_public_key(keys_[v].enc_public_key());
      if (!slices_.empty()) {
        for (const v1::SubmodelPlacement& at : slices_[v]->placement) *p->add_placement() = at;
      }
    }
  }
  stage_ = Stage::kShares;
  return out;
}

void SecAggRound::AddHoldingNeighbours(const std::vector<int>& members) {
  // Whether v's slice holds all of u's, once per pair of distinct slices.
  std::map<std::pair<const SecAggSlice*, const SecAggSlice*>, bool> known;
  const auto holds = [&](int v, int u) {
    const SecAggSlice *a = slices_[v].get(), *b = slices_[u].get();
    if (a == b) return true;
    auto it = known.find({a, b});
    if (it == known.end()) {
      const bool all = secagg::SharedIndices(*b->positions, *a->positions).size() == b->positions->size();
      it = known.emplace(std::pair{a, b}, all).first;
    }
    return it->second;
  };
  std::mt19937_64 rng(graph_seed_ + 1);
  const int want = (config_.k + 1) / 2;
  for (int u : members) {
    std::vector<int> holders;
    for (int v : members) {
      if (v != u && holds(v, u)) holders.push_back(v);
    }
    int have = CountIn(graph_[u], std::set<int>(holders.begin(), holders.end()));
    std::shuffle(holders.begin(), holders.end(), rng);
    for (int v : holders) {
      if (have >= want) break;
      if (graph_[u].insert(v).second) {
        graph_[v].insert(u);
        ++have;
      }
    }
  }
}

StatusOr<std::map<std::string, v1::ServerMessage>> SecAggRound::CloseShares() {
  std::set<int> u2 = Alive(u2_);
  // A client whose shares reached fewer than t others could not be unmasked: leave it
  // out (and repeat, since that takes holders from its neighbours).
  for (bool changed = true; changed;) {
    changed = false;
    for (auto it = u2.begin(); it != u2.end();) {
      if (CountIn(graph_[*it], u2) < config_.t) {
        it = u2.erase(it);
        changed = true;
      } else {
        ++it;
      }
    }
  }
  u2_ = u2;
  if (static_cast<int>(u2.size()) <= config_.t) {
    stage_ = Stage::kDone;
    return Abort(absl::StrCat(u2.size(), " clients can go on after sharing; more than t = ",
                              config_.t, " are needed"));
  }
  std::map<std::string, v1::ServerMessage> out;
  for (int v : u2) {
    for (int u : graph_[v]) {
      if (u2.count(u)) masked_with_[v].insert(u);
    }
    auto* m = out[clients_[v]].mutable_secagg_relay();
    for (const auto& c : inbox_[v]) {
      if (u2.count(c.from())) *m->add_shares() = c;
    }
  }
  inbox_.clear();
  stage_ = Stage::kMasked;
  return out;
}

StatusOr<std::map<std::string, v1::ServerMessage>> SecAggRound::CloseMasked() {
  const std::set<int> u3 = u3_;  // a masked input counts even if its sender left since
  if (static_cast<int>(u3.size()) < config_.t) {
    stage_ = Stage::kDone;
    return Abort(absl::StrCat(u3.size(), " masked inputs; at least t = ", config_.t,
                              " are needed"));
  }
  // Every secret that unmasking needs must have t holders among the survivors still here.
  const std::set<int> revealers = Alive(u3);
  for (int u : u2_) {
    const int holders = CountIn(masked_with_[u], revealers);
    const bool needed = u3.count(u) || holders > 0;
    if (needed && holders < config_.t) {
      stage_ = Stage::kDone;
      return Abort(absl::StrCat("client ", u, " has ", holders, " surviving neighbours; its ",
                                u3.count(u) ? "self mask" : "pairwise masks", " need t = ",
                                config_.t));
    }
  }
  std::map<std::string, v1::ServerMessage> out;
  for (int u : revealers) {
    auto* m = out[clients_[u]].mutable_secagg_unmask();
    for (int v : masked_with_[u]) {
      if (u3.count(v)) {
        m->add_survivors(v);
        asked_survivors_[u].insert(v);
      } else {
        m->add_dropped(v);
        asked_dropped_[u].insert(v);
      }
    }
  }
  stage_ = Stage::kUnmask;
  return out;
}

StatusOr<SecAggRound::Result> SecAggRound::Finish() const {
  if (stage_ != Stage::kDone || u3_.empty()) {
    return absl::FailedPreconditionError("secure aggregation has no unmasked sum");
  }
  secagg::Unmasking in;
  in.survivors = u3_;
  in.masked_sum = masked_sum_;
  for (const auto& [owner, shares] : self_seed_shares_) {
    if (u3_.count(owner)) in.self_seed[owner] = shares;
  }
  for (const auto& [owner, shares] : mask_key_shares_) {
    if (!u3_.count(owner)) in.mask_key[owner] = shares;
  }
  std::map<int, crypto::Bytes> public_keys;
  for (int u : u2_) public_keys[u] = keys_.at(u).mask_public_key();
  for (int u = 0; u < static_cast<int>(slices_.size()); ++u) in.slices[u] = slices_[u]->positions;
  auto sum = secagg::Unmask(in, masked_with_, public_keys, params_);
  if (!sum.ok()) return Abort(std::string(sum.status().message()));
  Result r;
  if (slices_.empty()) {
    r.sum = secagg::DequantizeSum(*sum, static_cast<int>(u3_.size()), params_);
  } else {  // each position's count: the survivors that hold it
    std::vector<int> count(length_, 0);
    for (int u : u3_) {
      for (int64_t p : *slices_[u]->positions) ++count[p];
    }
    r.sum = secagg::DequantizeSum(*sum, count, params_);
  }
  for (int u : u3_) r.survivors.push_back(clients_[u]);
  return r;
}

}  // namespace cleave
