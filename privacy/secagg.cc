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

// out += sign * PRG(seed), mod M.
Status AddPrg(std::vector<uint64_t>& out, const Bytes& seed, bool subtract, const Params& p) {
  ASSIGN_OR_RETURN(std::vector<uint64_t> mask, crypto::MaskPrg(seed, p.modulus, out.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = subtract ? SubMod(out[i], mask[i], p.modulus) : AddMod(out[i], mask[i], p.modulus);
  }
  return absl::OkStatus();
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
  const double levels = std::ldexp(1.0, p.bits) - 1;
  std::vector<double> out(sum.size());
  for (size_t i = 0; i < sum.size(); ++i) {
    out[i] = static_cast<double>(sum[i]) / levels * (2 * p.clip) - count * p.clip;
  }
  return out;
}

StatusOr<ClientKeys> NewClientKeys() {
  ClientKeys k;
  ASSIGN_OR_RETURN(k.mask_key, crypto::X25519Generate());
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

StatusOr<std::vector<uint64_t>> Mask(int u, const std::vector<uint64_t>& x, const ClientKeys& keys,
                                     const std::set<int>& neighbours,
                                     const std::map<int, Bytes>& public_keys, const Params& p) {
  std::vector<uint64_t> y = x;
  RETURN_IF_ERROR(AddPrg(y, keys.self_seed, false, p));
  for (int v : neighbours) {
    auto pk = public_keys.find(v);
    if (pk == public_keys.end()) return absl::FailedPreconditionError(absl::StrCat("no key of ", v));
    ASSIGN_OR_RETURN(Bytes seed, PairSeed(u, v, keys.mask_key.private_key, pk->second, p));
    RETURN_IF_ERROR(AddPrg(y, seed, /*subtract=*/v < u, p));
  }
  return y;
}

StatusOr<std::vector<uint64_t>> Unmask(const Unmasking& in, const std::vector<std::set<int>>& graph,
                                       const std::map<int, Bytes>& public_keys, size_t length,
                                       const Params& p) {
  for (const auto& [v, shares] : in.mask_key) {
    if (in.masked.count(v) || in.self_seed.count(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("client ", v, ": a survivor's mask key must never be reconstructed"));
    }
  }
  std::vector<uint64_t> sum(length, 0);
  for (const auto& [u, y] : in.masked) {
    if (y.size() != length) return absl::InvalidArgumentError("masked input of the wrong length");
    for (size_t i = 0; i < length; ++i) sum[i] = AddMod(sum[i], y[i], p.modulus);
    // Remove u's self mask.
    auto shares = in.self_seed.find(u);
    if (shares == in.self_seed.end() || static_cast<int>(shares->second.size()) < p.t) {
      return absl::FailedPreconditionError(
          absl::StrCat("client ", u, ": fewer than ", p.t, " shares of its self mask"));
    }
    ASSIGN_OR_RETURN(Bytes seed, crypto::ShamirCombine(shares->second, p.t, 32));
    RETURN_IF_ERROR(AddPrg(sum, seed, /*subtract=*/true, p));
  }
  // Remove the pairwise masks survivors shared with dropped clients (those between two
  // survivors cancel).
  for (int v = 0; v < static_cast<int>(graph.size()); ++v) {
    if (in.masked.count(v)) continue;
    bool touches_survivor = false;
    for (int u : graph[v]) touches_survivor |= in.masked.count(u) > 0;
    if (!touches_survivor) continue;
    auto shares = in.mask_key.find(v);
    if (shares == in.mask_key.end() || static_cast<int>(shares->second.size()) < p.t) {
      return absl::FailedPreconditionError(
          absl::StrCat("dropped client ", v, ": fewer than ", p.t, " shares of its mask key"));
    }
    ASSIGN_OR_RETURN(Bytes key, crypto::ShamirCombine(shares->second, p.t, 32));
    for (int u : graph[v]) {
      if (!in.masked.count(u)) continue;
      ASSIGN_OR_RETURN(Bytes seed, PairSeed(u, v, key, public_keys.at(u), p));
      // u added PRG(s_uv) when v > u and subtracted it when v < u: undo that.
      RETURN_IF_ERROR(AddPrg(sum, seed, /*subtract=*/v > u, p));
    }
  }
  return sum;
}

}  // namespace cleave::secagg
