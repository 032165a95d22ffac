#include "privacy/crypto.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <cstring>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"

namespace cleave::crypto {
namespace {

const unsigned char* U(const Bytes& b) { return reinterpret_cast<const unsigned char*>(b.data()); }
unsigned char* U(Bytes& b) { return reinterpret_cast<unsigned char*>(b.data()); }

Status Fail(const std::string& what) { return absl::InternalError(what + " failed (OpenSSL)"); }

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct PkeyCtxFree {
  void operator()(EVP_PKEY_CTX* p) const { EVP_PKEY_CTX_free(p); }
};
struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* p) const { EVP_CIPHER_CTX_free(p); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

Status NeedSize(const Bytes& b, size_t n, const char* what) {
  if (b.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be ", n, " bytes, not ", b.size()));
  }
  return absl::OkStatus();
}

// GF(2^61 - 1) arithmetic.
uint64_t Reduce(unsigned __int128 x) {
  uint64_t r = static_cast<uint64_t>(x & kShamirPrime) + static_cast<uint64_t>(x >> 61);
  r = (r & kShamirPrime) + (r >> 61);
  return r >= kShamirPrime ? r - kShamirPrime : r;
}
uint64_t Add(uint64_t a, uint64_t b) { return Reduce(static_cast<unsigned __int128>(a) + b); }
uint64_t Sub(uint64_t a, uint64_t b) { return Add(a, kShamirPrime - b); }
uint64_t Mul(uint64_t a, uint64_t b) { return Reduce(static_cast<unsigned __int128>(a) * b); }
uint64_t Pow(uint64_t a, uint64_t e) {
  uint64_t r = 1;
  for (; e; e >>= 1, a = Mul(a, a)) {
    if (e & 1) r = Mul(r, a);
  }
  return r;
}
uint64_t Inv(uint64_t a) { return Pow(a, kShamirPrime - 2); }

StatusOr<uint64_t> RandomField() {
  while (true) {  // uniform in [0, p): rejection from 61 random bits
    uint64_t v;
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&v), sizeof(v)) != 1) return Fail("RAND_bytes");
    v &= kShamirPrime;
    if (v < kShamirPrime) return v;
  }
}

constexpr size_t kChunk = 7;  // bytes per field element (56 bits < 61)

}  // namespace

StatusOr<Bytes> RandomBytes(size_t n) {
  Bytes out(n, '\0');
  if (n > 0 && RAND_bytes(U(out), static_cast<int>(n)) != 1) return Fail("RAND_bytes");
  return out;
}

StatusOr<X25519KeyPair> X25519Generate() {
  ASSIGN_OR_RETURN(Bytes priv, RandomBytes(32));
  ASSIGN_OR_RETURN(Bytes pub, X25519PublicKey(priv));
  return X25519KeyPair{std::move(priv), std::move(pub)};
}

StatusOr<Bytes> X25519PublicKey(const Bytes& private_key) {
  RETURN_IF_ERROR(NeedSize(private_key, 32, "an X25519 private key"));
  Pkey key(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, U(private_key), 32));
  if (!key) return Fail("X25519 key");
  Bytes pub(32, '\0');
  size_t len = 32;
  if (EVP_PKEY_get_raw_public_key(key.get(), U(pub), &len) != 1 || len != 32) {
    return Fail("X25519 public key");
  }
  return pub;
}

StatusOr<Bytes> X25519Shared(const Bytes& private_key, const Bytes& peer_public_key) {
  RETURN_IF_ERROR(NeedSize(private_key, 32, "an X25519 private key"));
  RETURN_IF_ERROR(NeedSize(peer_public_key, 32, "an X25519 public key"));
  Pkey key(EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nullptr, U(private_key), 32));
  Pkey peer(EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, U(peer_public_key), 32));
  if (!key || !peer) return Fail("X25519 key");
  std::unique_ptr<EVP_PKEY_CTX, PkeyCtxFree> ctx(EVP_PKEY_CTX_new(key.get(), nullptr));
  Bytes shared(32, '\0');
  size_t len = 32;
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) != 1 || EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) != 1 ||
      EVP_PKEY_derive(ctx.get(), U(shared), &len) != 1 || len != 32) {
    // OpenSSL refuses an all-zero result (a low-order peer key) here too.
    return absl::InvalidArgumentError("X25519 key agreement failed (invalid peer key?)");
  }
  const Bytes zero(32, '\0');
  if (CRYPTO_memcmp(shared.data(), zero.data(), 32) == 0) {
    return absl::InvalidArgumentError("X25519 shared secret is zero (low-order peer key)");
  }
  return shared;
}

StatusOr<Bytes> HkdfSha256(const Bytes& ikm, const Bytes& salt, const Bytes& info, size_t length) {
  if (length == 0 || length > 255 * 32) return absl::InvalidArgumentError("HKDF length out of range");
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  EVP_KDF_CTX* ctx = kdf ? EVP_KDF_CTX_new(kdf) : nullptr;
  EVP_KDF_free(kdf);
  if (!ctx) return Fail("HKDF");
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<char*>(ikm.data()), ikm.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<char*>(salt.data()), salt.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(info.data()), info.size()),
      OSSL_PARAM_construct_end()};
  Bytes out(length, '\0');
  const int ok = EVP_KDF_derive(ctx, U(out), length, params);
  EVP_KDF_CTX_free(ctx);
  if (ok != 1) return Fail("HKDF derive");
  return out;
}

StatusOr<Bytes> AeadSeal(const Bytes& key, const Bytes& nonce, const Bytes& aad, const Bytes& plaintext) {
  RETURN_IF_ERROR(NeedSize(key, 32, "an AES-256-GCM key"));
  RETURN_IF_ERROR(NeedSize(nonce, 12, "an AES-256-GCM nonce"));
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  Bytes out(plaintext.size() + 16, '\0');
  int len = 0, fin = 0;
  if (!ctx || EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, U(key), U(nonce)) != 1 ||
      EVP_EncryptUpdate(ctx.get(), nullptr, &len, U(aad), static_cast<int>(aad.size())) != 1 ||
      EVP_EncryptUpdate(ctx.get(), U(out), &len, U(plaintext), static_cast<int>(plaintext.size())) != 1 ||
      EVP_EncryptFinal_ex(ctx.get(), U(out) + len, &fin) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, 16, U(out) + plaintext.size()) != 1) {
    return Fail("AES-256-GCM seal");
  }
  return out;
}

StatusOr<Bytes> AeadOpen(const Bytes& key, const Bytes& nonce, const Bytes& aad, const Bytes& sealed) {
  RETURN_IF_ERROR(NeedSize(key, 32, "an AES-256-GCM key"));
  RETURN_IF_ERROR(NeedSize(nonce, 12, "an AES-256-GCM nonce"));
  if (sealed.size() < 16) return absl::InvalidArgumentError("sealed message shorter than its tag");
  const size_t n = sealed.size() - 16;
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  Bytes out(n, '\0');
  Bytes tag = sealed.substr(n);
  int len = 0, fin = 0;
  if (!ctx || EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, U(key), U(nonce)) != 1 ||
      EVP_DecryptUpdate(ctx.get(), nullptr, &len, U(aad), static_cast<int>(aad.size())) != 1 ||
      EVP_DecryptUpdate(ctx.get(), U(out), &len, U(sealed), static_cast<int>(n)) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, 16, U(tag)) != 1 ||
      EVP_DecryptFinal_ex(ctx.get(), U(out) + len, &fin) != 1) {
    return absl::InvalidArgumentError("authentication failed: the ciphertext, its associated data "
                                      "or its key is not what was sealed");
  }
  return out;
}

StatusOr<Bytes> Aes256CtrKeystream(const Bytes& key, const Bytes& counter, size_t length) {
  RETURN_IF_ERROR(NeedSize(key, 32, "an AES-256-CTR key"));
  RETURN_IF_ERROR(NeedSize(counter, 16, "an AES-256-CTR counter block"));
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  const Bytes zeros(length, '\0');
  Bytes out(length, '\0');
  int len = 0;
  if (!ctx || EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_ctr(), nullptr, U(key), U(counter)) != 1 ||
      EVP_EncryptUpdate(ctx.get(), U(out), &len, U(zeros), static_cast<int>(length)) != 1) {
    return Fail("AES-256-CTR");
  }
  return out;
}

StatusOr<std::vector<uint64_t>> MaskPrg(const Bytes& seed, uint64_t modulus, size_t n) {
  if (modulus < 2) return absl::InvalidArgumentError("mask modulus must be >= 2");
  RETURN_IF_ERROR(NeedSize(seed, 32, "a mask seed"));
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  const Bytes counter(16, '\0');
  if (!ctx || EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_ctr(), nullptr, U(seed), U(counter)) != 1) {
    return Fail("AES-256-CTR");
  }
  // Accept draws below the largest multiple of the modulus that fits in 64 bits.
  const bool power_of_two = (modulus & (modulus - 1)) == 0;
  const uint64_t limit = power_of_two ? 0 : (~uint64_t{0} / modulus) * modulus;
  std::vector<uint64_t> out;
  out.reserve(n);
  Bytes zeros(8 * 1024, '\0'), block(8 * 1024, '\0');
  while (out.size() < n) {
    int len = 0;
    if (EVP_EncryptUpdate(ctx.get(), U(block), &len, U(zeros), static_cast<int>(zeros.size())) != 1) {
      return Fail("AES-256-CTR");
    }
    for (size_t i = 0; i + 8 <= block.size() && out.size() < n; i += 8) {
      uint64_t v;
      std::memcpy(&v, block.data() + i, 8);
      if (power_of_two) {
        out.push_back(v & (modulus - 1));
      } else if (v < limit) {
        out.push_back(v % modulus);
      }
    }
  }
  return out;
}

StatusOr<std::vector<Share>> ShamirSplit(const Bytes& secret, int t, int n) {
  if (t < 1 || n < t || n > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("Shamir: need 1 <= t <= n, got t = ", t, ", n = ", n));
  }
  const size_t chunks = (secret.size() + kChunk - 1) / kChunk;
  std::vector<Share> shares(n);
  for (int i = 0; i < n; ++i) {
    shares[i].x = static_cast<uint32_t>(i + 1);
    shares[i].y.resize(chunks);
  }
  std::vector<uint64_t> coef(t);
  for (size_t c = 0; c < chunks; ++c) {
    uint64_t s = 0;
    for (size_t b = 0; b < kChunk && c * kChunk + b < secret.size(); ++b) {
      s |= static_cast<uint64_t>(static_cast<uint8_t>(secret[c * kChunk + b])) << (8 * b);
    }
    coef[0] = s;
    for (int k = 1; k < t; ++k) {
      ASSIGN_OR_RETURN(coef[k], RandomField());
    }
    for (int i = 0; i < n; ++i) {  // Horner at x = i + 1
      uint64_t y = 0;
      for (int k = t - 1; k >= 0; --k) y = Add(Mul(y, i + 1), coef[k]);
      shares[i].y[c] = y;
    }
  }
  for (auto& k : coef) k = 0;
  return shares;
}

StatusOr<Bytes> ShamirCombine(const std::vector<Share>& shares, int t, size_t length) {
  if (t < 1 || static_cast<int>(shares.size()) < t) {
    return absl::FailedPreconditionError(
        absl::StrCat("Shamir: ", shares.size(), " shares, ", t, " needed"));
  }
  const size_t chunks = (length + kChunk - 1) / kChunk;
  std::set<uint32_t> xs;
  for (int i = 0; i < t; ++i) {
    if (shares[i].x == 0 || shares[i].x >= kShamirPrime || !xs.insert(shares[i].x).second) {
      return absl::InvalidArgumentError("Shamir: share x must be distinct and nonzero");
    }
    if (shares[i].y.size() != chunks) {
      return absl::InvalidArgumentError("Shamir: a share does not match the secret's length");
    }
    for (uint64_t y : shares[i].y) {
      if (y >= kShamirPrime) return absl::InvalidArgumentError("Shamir: share value out of the field");
    }
  }
  // Lagrange at 0 over the first t shares.
  std::vector<uint64_t> lambda(t);
  for (int i = 0; i < t; ++i) {
    uint64_t num = 1, den = 1;
    for (int j = 0; j < t; ++j) {
      if (j == i) continue;
      num = Mul(num, shares[j].x);
      den = Mul(den, Sub(shares[j].x, shares[i].x));
    }
    lambda[i] = Mul(num, Inv(den));
  }
  Bytes out(length, '\0');
  for (size_t c = 0; c < chunks; ++c) {
    uint64_t s = 0;
    for (int i = 0; i < t; ++i) s = Add(s, Mul(lambda[i], shares[i].y[c]));
    if (s >> (8 * kChunk)) return absl::DataLossError("Shamir: shares do not combine to a secret");
    for (size_t b = 0; b < kChunk && c * kChunk + b < length; ++b) {
      out[c * kChunk + b] = static_cast<char>((s >> (8 * b)) & 0xff);
    }
  }
  return out;
}

}  // namespace cleave::crypto
