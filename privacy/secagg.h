// SecAgg+ (Bell et al., CCS 2020) as a computation, without the network: the neighbour
// graph, quantization of clipped updates into Z_M, masking with pairwise and self masks,
// Shamir shares of each client's mask secrets for its neighbours, and the server's
// unmasking when some clients drop out, and the sealing of the shares the server relays.
// The wire protocol (server/modes/secagg_round.h, the client) moves these values;
// tests/privacy/secagg_test.cc checks that masks cancel exactly.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "core/status.h"
#include "privacy/crypto.h"

namespace cleave::secagg {

using crypto::Bytes;

struct Params {
  int k = 4;        // neighbours per client (SecAgg+'s graph degree; all others if >= n-1)
  int t = 3;        // shares needed to recover a client's secret (t <= k)
  double clip = 1;  // each coordinate is clipped to [-clip, clip]
  int bits = 16;    // quantization levels: 2^bits over [-clip, clip]
  uint64_t modulus = uint64_t{1} << 32;  // the group Z_M the sums live in (any M >= 2)
  Bytes context;    // binds keys to run and round ("run|round")
};

// A k-regular neighbour graph on clients 0..n-1: a ring over a seeded random
// permutation, each client joined to the k/2 nearest on each side (k rounded up to even,
// capped at n - 1). Symmetric.
std::vector<std::set<int>> NeighbourGraph(int n, int k, uint64_t seed);

// Clips to [-clip, clip], maps to [0, 2^bits - 1] with stochastic rounding (unbiased),
// into Z_M (M must exceed the number of clients times 2^bits for sums not to wrap). Dequantize inverts a sum of `count` such vectors.
std::vector<uint64_t> Quantize(const std::vector<float>& x, const Params& p, std::mt19937_64& rng);
std::vector<double> DequantizeSum(const std::vector<uint64_t>& sum, int count, const Params& p);

std::vector<double> DequantizeSum(const std::vector<uint64_t>& sum, const std::vector<int>& counts,
                                  const Params& p);  // count per element

// Per-slice masking (width-scaled submodels): client u's input holds the values at the
// summed vector's positions `slices[u]` (distinct), in that order, and the server adds it
// there. A pair's mask covers the positions both hold, in increasing position, so the
// masks cancel in the sum and no input is longer than its client's slice. Clients that
// hold the whole vector (no slices) are the special case slice = 0..length-1.
using Positions = std::vector<int64_t>;
using Slices = std::map<int, std::shared_ptr<const Positions>>;
// The indices into `mine` of the positions `theirs` holds too, in increasing position.
std::vector<int64_t> SharedIndices(const Positions& mine, const Positions& theirs);
// How many of `mine`'s positions none of `theirs` holds: values the pair masks leave
// under the self mask alone, which the server reads once it unmasks.
int64_t Uncovered(const Positions& mine, const std::vector<const Positions*>& theirs);

// One client's secrets and public keys for a round.
struct ClientKeys {
  crypto::X25519KeyPair mask_key;  // pairwise masks: agreed with each neighbour
  crypto::X25519KeyPair enc_key;   // encrypts the shares sent through the server
  Bytes self_seed;                 // 32 bytes: the self mask b_u
};
StatusOr<ClientKeys> NewClientKeys();

// The shares client `u` gives neighbour v: of its self seed and of its mask private key.
struct SharesFor {
  crypto::Share self_seed, mask_key;
};
// u's shares for each of its neighbours (x = position among them, 1-based).
StatusOr<std::map<int, SharesFor>> ShareSecrets(int u, const ClientKeys& keys,
                                                const std::set<int>& neighbours, const Params& p);

// The shares `from` gives `to`, sealed with AES-256-GCM under HKDF(X25519(our enc key,
// their enc public key)) bound to the context and the pair, with the context and the
// direction as associated data: a ciphertext opened by anyone else, for another pair,
// round or direction, or altered, fails. Output: 12-byte random nonce || ciphertext || tag.
StatusOr<Bytes> SealShares(int from, int to, const SharesFor& shares, const Bytes& enc_private_key,
                           const Bytes& to_enc_public_key, const Params& p);
StatusOr<SharesFor> OpenShares(int from, int to, const Bytes& sealed, const Bytes& enc_private_key,
                               const Bytes& from_enc_public_key, const Params& p);

// y_u = x_u + PRG(b_u) + sum over neighbours v > u of PRG(s_uv) - sum over v < u, mod M;
// `public_keys` holds every client's mask public key. With `slices` (u's and each
// neighbour's), each pair's PRG covers only the positions both hold.
StatusOr<std::vector<uint64_t>> Mask(int u, const std::vector<uint64_t>& x, const ClientKeys& keys,
                                     const std::set<int>& neighbours,
                                     const std::map<int, Bytes>& public_keys, const Params& p,
                                     const Slices* slices = nullptr);

// The server: the sum of the survivors' x, given the sum of their masked inputs (mod M),
// and for each survivor u the self-seed shares its surviving neighbours returned, and
// for each dropped client v the mask-key shares its surviving neighbours returned. Never
// both kinds for one client. `graph` holds the edges survivors masked with (a client's
// neighbours that reached the masking stage). FAILED_PRECONDITION when some client has
// fewer than t shares.
struct Unmasking {
  std::set<int> survivors;                              // whose y_u are in masked_sum
  std::vector<uint64_t> masked_sum;                     // sum of the survivors' y_u
  std::map<int, std::vector<crypto::Share>> self_seed;  // survivor u -> shares of b_u
  std::map<int, std::vector<crypto::Share>> mask_key;   // dropped v -> shares of its key
  Slices slices;  // per-slice masking: every client's positions (empty: the whole vector)
};
// sum += y (mod M), element by element; with `at`, y[i] is added to sum[at[i]].
void AddMod(std::vector<uint64_t>& sum, const std::vector<uint64_t>& y, uint64_t modulus);
void AddMod(std::vector<uint64_t>& sum, const std::vector<uint64_t>& y, const Positions& at, uint64_t modulus);
StatusOr<std::vector<uint64_t>> Unmask(const Unmasking& in, const std::vector<std::set<int>>& graph,
                                       const std::map<int, Bytes>& public_keys, const Params& p);

}  // namespace cleave::secagg
