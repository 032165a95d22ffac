// The primitives secure aggregation (SecAgg+, issue 5) is built from, each a thin layer
// over OpenSSL 3 with known-answer tests (tests/privacy/crypto_test.cc):
//   X25519 key agreement (RFC 7748), HKDF-SHA256 (RFC 5869), AES-256-GCM for the shares
//   the server relays, an AES-256-CTR keystream (NIST SP 800-38A) as the mask PRG, and
//   Shamir t-of-n secret sharing over GF(2^61 - 1).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace cleave::crypto {

using Bytes = std::string;  // binary

// `n` bytes from OpenSSL's CSPRNG.
StatusOr<Bytes> RandomBytes(size_t n);

// X25519: a fresh key pair, and the shared secret of our private key and their public
// key (32 bytes each). An all-zero shared secret (a low-order public key) is an error.
struct X25519KeyPair {
  Bytes private_key, public_key;
};
StatusOr<X25519KeyPair> X25519Generate();
StatusOr<Bytes> X25519PublicKey(const Bytes& private_key);
StatusOr<Bytes> X25519Shared(const Bytes& private_key, const Bytes& peer_public_key);

// HKDF-SHA256 (extract then expand) of `length` bytes (at most 255 * 32).
StatusOr<Bytes> HkdfSha256(const Bytes& ikm, const Bytes& salt, const Bytes& info, size_t length);

// AES-256-GCM with a 12-byte nonce: ciphertext || 16-byte tag. Open fails (and returns
// no plaintext) when the key, nonce, associated data or any byte differ.
StatusOr<Bytes> AeadSeal(const Bytes& key, const Bytes& nonce, const Bytes& aad, const Bytes& plaintext);
StatusOr<Bytes> AeadOpen(const Bytes& key, const Bytes& nonce, const Bytes& aad, const Bytes& sealed);

// AES-256-CTR: `length` keystream bytes from a 32-byte key and a 16-byte initial counter
// block (XOR it with data to encrypt).
StatusOr<Bytes> Aes256CtrKeystream(const Bytes& key, const Bytes& counter, size_t length);

// A cryptographic PRG for masks: `n` values uniform in [0, modulus) from a 32-byte seed
// (AES-256-CTR keystream, counter from zero; 64-bit draws, rejection sampling when the
// modulus is not a power of two, so there is no modulo bias). modulus >= 2.
StatusOr<std::vector<uint64_t>> MaskPrg(const Bytes& seed, uint64_t modulus, size_t n);

// Shamir secret sharing over GF(p), p = 2^61 - 1. A secret of any length is split into
// 7-byte chunks, each shared with its own random polynomial of degree t - 1; share i
// (x = i, 1-based) holds one field element per chunk.
inline constexpr uint64_t kShamirPrime = (uint64_t{1} << 61) - 1;
struct Share {
  uint32_t x = 0;
  std::vector<uint64_t> y;
};
// n shares, any t of which recover `secret`; 1 <= t <= n < p.
StatusOr<std::vector<Share>> ShamirSplit(const Bytes& secret, int t, int n);
// Recovers a secret of `length` bytes from at least `t` shares with distinct x. With
// fewer than t shares the result is (with overwhelming probability) not the secret; this
// refuses fewer than t, duplicate x, x = 0 and inconsistent lengths.
StatusOr<Bytes> ShamirCombine(const std::vector<Share>& shares, int t, size_t length);

}  // namespace cleave::crypto
