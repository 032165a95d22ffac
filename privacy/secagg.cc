#include "privacy/secagg.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace cleave::secagg {
namespace {

uint64_t AddMod(uint64_t a, uint64_t b, uint64_t m) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) + b) % m);
}
uint64_t SubMod(uint64_t a, uint64_t b, uint64_t m) { return AddMod(a, m - b % m, m); }

// The pairwise seed of u and v: HKDF of their X25519 secret, bound to the context and
// to the (unordered) pair.
StatusOr<Bytes> PairSeed(int u, int v, const Bytes& private_key, const Bytes& peer_public,
                         const Params& p) {
  ASSIGN_OR_RETURN(Bytes shared, crypto::X25519Shared(private_key, peer_public));
  return crypto::HkdfSha256(shared, p.context,
                            absl::StrCat("cleave secagg pair ", std::min(u, v), " ", std::max(u, v)),
                            32);
}

// out += sign * PRG(seed), mod M; with `at`, PRG(seed)'s i-th value goes to out[at[i]].
Status AddPrg(std::vector<uint64_t>& out, const Bytes& seed, bool subtract, const Params& p,
              const std::vector<int64_t>* at = nullptr) {
  const size_t n = at ? at->size() : out.size();
  ASSIGN_OR_RETURN(std::vector<uint64_t> mask, crypto::MaskPrg(seed, p.modulus, n));
  for (size_t i = 0; i < n; ++i) {
    uint64_t& o = out[at ? static_cast<size_t>((*at)[i]) : i];
    o = subtract ? SubMod(o, mask[i], p.modulus) : AddMod(o, mask[i], p.modulus);
  }
  return absl::OkStatus();
}

// Client c's slice; INVALID_ARGUMENT when `slices` has none.
StatusOr<const Positions*> SliceOf(const Slices& slices, int c) {
  auto it = slices.find(c);
  if (it == slices.end() || !it->second) return absl::InvalidArgumentError(absl::StrCat("no slice of ", c));
  return it->second.get();
}

// `indices` into `slice`, as the positions they hold.
std::vector<int64_t> At(const Positions& slice, const std::vector<int64_t>& indices) {
  std::vector<int64_t> out(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) out[i] = slice[indices[i]];
  return out;
}

}  // namespace

std::vector<std::set<int>> NeighbourGraph(int n, int k, uint64_t seed) {
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  const int half = std::min((k + 1) / 2, (n - 1) / 2 + 1);
  std::vector<std::set<int>> g(n);
  for (int i = 0; i < n; ++i) {
    for (int d = 1; d <= half; ++d) {
      const int a = order[i], b = order[(i + d) % n];
      if (a == b) continue;
      g[a].insert(b);
      g[b].insert(a);
    }
  }
  return g;
}

std::vector<uint64_t> Quantize(const std::vector<float>& x, const Params& p, std::mt19937_64& rng) {
  const double levels = std::ldexp(1.0, p.bits) - 1;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<uint64_t> q(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double c = std::clamp(static_cast<double>(x[i]), -p.clip, p.clip);
    const double scaled = (c + p.clip) / (2 * p.clip) * levels;  // in [0, levels]
    double level = std::floor(scaled);
    if (u(rng) < scaled - level) level += 1;
    q[i] = static_cast<uint64_t>(level) % p.modulus;
  }
  return q;
}

std::vector<double> DequantizeSum(const std::vector<uint64_t>& sum, int count, const Params& p) {
  return DequantizeSum(sum, std::vector<int>(sum.size(), count), p);
}

std::vector<double> DequantizeSum(const std::vector<uint64_t>& sum, const std::vector<int>& counts,
                                  const Params& p) {
  const double levels = std::ldexp(1.0, p.bits) - 1;
  std::vector<double> out(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) {
    out[i] = static_cast<double>(sum[i]) / levels * (2 * p.clip) - counts[i] * p.clip;
  }
  return out;
}

std::vector<int64_t> SharedIndices(const Positions& mine, const Positions& theirs) {
  std::vector<int64_t> order(mine.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return mine[a] < mine[b]; });
  Positions sorted = theirs;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> out;
  auto t = sorted.begin();
  for (int64_t i : order) {
    t = std::lower_bound(t, sorted.end(), mine[i]);
    if (t == sorted.end()) break;
    if (*t == mine[i]) out.push_back(i);
  }
  return out;
}

int64_t Uncovered(const Positions& mine, const std::vector<const Positions*>& theirs) {
  std::vector<char> covered(mine.size(), 0);
  for (const Positions* other : theirs) {
    for (int64_t i : SharedIndices(mine, *other)) covered[i] = 1;
  }
  return std::count(covered.begin(), covered.end(), 0);
}

StatusOr<ClientKeys> NewClientKeys() {
  ClientKeys k;
  ASSIGN_OR_RETURN(k.mask_key, crypto::X25519Generate());
  ASSIGN_OR_RETURN(k.enc_key, crypto::X25519Generate());
  ASSIGN_OR_RETURN(k.self_seed, crypto::RandomBytes(32));
  return k;
}

StatusOr<std::map<int, SharesFor>> ShareSecrets(int u, const ClientKeys& keys,
                                                const std::set<int>& neighbours, const Params& p) {
  const int n = static_cast<int>(neighbours.size());
  if (p.t < 1 || p.t > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("client ", u, ": threshold ", p.t, " with ", n, " neighbours"));
  }
  ASSIGN_OR_RETURN(auto seed_shares, crypto::ShamirSplit(keys.self_seed, p.t, n));
  ASSIGN_OR_RETURN(auto key_shares, crypto::ShamirSplit(keys.mask_key.private_key, p.t, n));
  std::map<int, SharesFor> out;
  int i = 0;
  for (int v : neighbours) {
    out[v] = {seed_shares[i], key_shares[i]};
    ++i;
  }
  return out;
}

namespace {

void PutU32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t GetLe(const Bytes& in, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(in[pos + i])} << (8 * i);
  return v;
}

// x (4 bytes), count (4), count field elements (8 each), for each of the two shares.
Bytes EncodeShares(const SharesFor& s) {
  Bytes out;
  for (const crypto::Share* sh : {&s.self_seed, &s.mask_key}) {
    PutU32(out, sh->x);
    PutU32(out, static_cast<uint32_t>(sh->y.size()));
    for (uint64_t y : sh->y) {
      for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(y >> (8 * i)));
    }
  }
  return out;
}

StatusOr<SharesFor> DecodeShares(const Bytes& in) {
  SharesFor s;
  size_t pos = 0;
  for (crypto::Share* sh : {&s.self_seed, &s.mask_key}) {
    if (in.size() < pos + 8) return absl::InvalidArgumentError("truncated shares");
    sh->x = static_cast<uint32_t>(GetLe(in, pos, 4));
    const uint64_t count = GetLe(in, pos + 4, 4);
    pos += 8;
    if (count > 64 || in.size() < pos + 8 * count) return absl::InvalidArgumentError("bad shares");
    for (uint64_t i = 0; i < count; ++i, pos += 8) sh->y.push_back(GetLe(in, pos, 8));
  }
  if (pos != in.size()) return absl::InvalidArgumentError("trailing bytes after shares");
  return s;
}

// Key and associated data for shares sent from `from` to `to`.
StatusOr<std::pair<Bytes, Bytes>> ShareKey(int from, int to, const Bytes& private_key,
                                           const Bytes& peer_public, const Params& p) {
  ASSIGN_OR_RETURN(Bytes shared, crypto::X25519Shared(private_key, peer_public));
  ASSIGN_OR_RETURN(Bytes key, crypto::HkdfSha256(shared, p.context,
                                                 absl::StrCat("cleave secagg shares ",
                                                              std::min(from, to), " ",
                                                              std::max(from, to)),
                                                 32));
  return std::pair{key, absl::StrCat(p.context, "|shares from ", from, " to ", to)};
}

}  // namespace

StatusOr<Bytes> SealShares(int from, int to, const SharesFor& shares, const Bytes& enc_private_key,
                           const Bytes& to_enc_public_key, const Params& p) {
  ASSIGN_OR_RETURN(auto key, ShareKey(from, to, enc_private_key, to_enc_public_key, p));
  ASSIGN_OR_RETURN(Bytes nonce, crypto::RandomBytes(12));
  ASSIGN_OR_RETURN(Bytes sealed, crypto::AeadSeal(key.first, nonce, key.second, EncodeShares(shares)));
  return nonce + sealed;
}

StatusOr<SharesFor> OpenShares(int from, int to, const Bytes& sealed, const Bytes& enc_private_key,
                               const Bytes& from_enc_public_key, const Params& p) {
  if (sealed.size() < 12 + 16) return absl::InvalidArgumentError("sealed shares too short");
  ASSIGN_OR_RETURN(auto key, ShareKey(from, to, enc_private_key, from_enc_public_key, p));
  ASSIGN_OR_RETURN(Bytes plain,
                   crypto::AeadOpen(key.first, sealed.substr(0, 12), key.second, sealed.substr(12)));
  return DecodeShares(plain);
}

void AddMod(std::vector<uint64_t>& sum, const std::vector<uint64_t>& y, uint64_t modulus) {
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = AddMod(sum[i], y[i], modulus);
}

void AddMod(std::vector<uint64_t>& sum, const std::vector<uint64_t>& y, const Positions& at, uint64_t modulus) {
  for (size_t i = 0; i < y.size(); ++i) sum[at[i]] = AddMod(sum[at[i]], y[i], modulus);
}

StatusOr<std::vector<uint64_t>> Mask(int u, const std::vector<uint64_t>& x, const ClientKeys& keys,
                                     const std::set<int>& neighbours,
                                     const std::map<int, Bytes>& public_keys, const Params& p,
                                     const Slices* slices) {
  const Positions* mine = nullptr;
  if (slices) {
    ASSIGN_OR_RETURN(mine, SliceOf(*slices, u));
    if (mine->size() != x.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("client ", u, ": ", x.size(), " values for a slice of ", mine->size()));
    }
  }
  std::vector<uint64_t> y = x;
  RETURN_IF_ERROR(AddPrg(y, keys.self_seed, false, p));
  for (int v : neighbours) {
    auto pk = public_keys.find(v);
    if (pk == public_keys.end()) return absl::FailedPreconditionError(absl::StrCat("no key of ", v));
    ASSIGN_OR_RETURN(Bytes seed, PairSeed(u, v, keys.mask_key.private_key, pk->second, p));
    if (slices) {
      ASSIGN_OR_RETURN(const Positions* theirs, SliceOf(*slices, v));
      const std::vector<int64_t> shared = SharedIndices(*mine, *theirs);
      RETURN_IF_ERROR(AddPrg(y, seed, /*subtract=*/v < u, p, &shared));
    } else {
      RETURN_IF_ERROR(AddPrg(y, seed, /*subtract=*/v < u, p));
    }
  }
  return y;
}

StatusOr<std::vector<uint64_t>> Unmask(const Unmasking& in, const std::vector<std::set<int>>& graph,
                                       const std::map<int, Bytes>& public_keys, const Params& p) {
  for (const auto& [v, shares] : in.mask_key) {
    if (in.survivors.count(v) || in.self_seed.count(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("client ", v, ": a survivor's mask key must never be reconstructed"));
    }
  }
  const bool sliced = !in.slices.empty();
  std::vector<uint64_t> sum = in.masked_sum;
  for (int u : in.survivors) {
    // Remove u's self mask.
    auto shares = in.self_seed.find(u);
    if (shares == in.self_seed.end() || static_cast<int>(shares->second.size()) < p.t) {
      return absl::FailedPreconditionError(
          absl::StrCat("client ", u, ": fewer than ", p.t, " shares of its self mask"));
    }
    ASSIGN_OR_RETURN(Bytes seed, crypto::ShamirCombine(shares->second, p.t, 32));
    const Positions* at = nullptr;
    if (sliced) {
      ASSIGN_OR_RETURN(at, SliceOf(in.slices, u));
    }
    RETURN_IF_ERROR(AddPrg(sum, seed, /*subtract=*/true, p, at));
  }
  // Remove the pairwise masks survivors shared with dropped clients (those between two
  // survivors cancel).
  for (int v = 0; v < static_cast<int>(graph.size()); ++v) {
    if (in.survivors.count(v)) continue;
    bool touches_survivor = false;
    for (int u : graph[v]) touches_survivor |= in.survivors.count(u) > 0;
    if (!touches_survivor) continue;
    auto shares = in.mask_key.find(v);
    if (shares == in.mask_key.end() || static_cast<int>(shares->second.size()) < p.t) {
      return absl::FailedPreconditionError(
          absl::StrCat("dropped client ", v, ": fewer than ", p.t, " shares of its mask key"));
    }
    ASSIGN_OR_RETURN(Bytes key, crypto::ShamirCombine(shares->second, p.t, 32));
    for (int u : graph[v]) {
      if (!in.survivors.count(u)) continue;
      ASSIGN_OR_RETURN(Bytes seed, PairSeed(u, v, key, public_keys.at(u), p));
      // u added PRG(s_uv) when v > u and subtracted it when v < u: undo that.
      if (sliced) {
        ASSIGN_OR_RETURN(const Positions* mine, SliceOf(in.slices, u));
        ASSIGN_OR_RETURN(const Positions* theirs, SliceOf(in.slices, v));
        const std::vector<int64_t> at = At(*mine, SharedIndices(*mine, *theirs));
        RETURN_IF_ERROR(AddPrg(sum, seed, /*subtract=*/v > u, p, &at));
      } else {
        RETURN_IF_ERROR(AddPrg(sum, seed, /*subtract=*/v > u, p));
      }
    }
  }
  return sum;
}

}  // namespace cleave::secagg
