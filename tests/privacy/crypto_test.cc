// Known-answer tests of each primitive as secure aggregation uses it, and Shamir.
#include "privacy/crypto.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace cleave::crypto {
namespace {

Bytes Hex(const std::string& hex) {
  Bytes out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string ToHex(const Bytes& b) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

// RFC 7748, section 6.1.
TEST(CryptoTest, X25519MatchesRfc7748) {
  const Bytes alice = Hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
  const Bytes bob = Hex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb");
  EXPECT_EQ(ToHex(*X25519PublicKey(alice)),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
  EXPECT_EQ(ToHex(*X25519PublicKey(bob)),
            "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
  const std::string shared = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742";
  EXPECT_EQ(ToHex(*X25519Shared(alice, *X25519PublicKey(bob))), shared);
  EXPECT_EQ(ToHex(*X25519Shared(bob, *X25519PublicKey(alice))), shared);
  // A low-order point (here zero) gives an all-zero secret: refused.
  EXPECT_FALSE(X25519Shared(alice, Bytes(32, '\0')).ok());
  EXPECT_EQ(X25519Shared(alice, Bytes(31, 'x')).status().code(), absl::StatusCode::kInvalidArgument);
  auto a = *X25519Generate(), b = *X25519Generate();
  EXPECT_EQ(*X25519Shared(a.private_key, b.public_key), *X25519Shared(b.private_key, a.public_key));
}

// RFC 5869, test cases 1 and 3.
TEST(CryptoTest, HkdfSha256MatchesRfc5869) {
  EXPECT_EQ(ToHex(*HkdfSha256(Hex("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"),
                              Hex("000102030405060708090a0b0c"), Hex("f0f1f2f3f4f5f6f7f8f9"), 42)),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
  EXPECT_EQ(ToHex(*HkdfSha256(Hex("0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"), "", "", 42)),
            "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8");
}

// NIST SP 800-38A, F.5.5 CTR-AES256.Encrypt.
TEST(CryptoTest, Aes256CtrMatchesSp800_38a) {
  const Bytes key = Hex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4");
  const Bytes counter = Hex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff");
  const Bytes plain = Hex(
      "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51"
      "30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710");
  Bytes stream = *Aes256CtrKeystream(key, counter, plain.size());
  for (size_t i = 0; i < plain.size(); ++i) stream[i] ^= plain[i];
  EXPECT_EQ(ToHex(stream),
            "601ec313775789a5b7a7f504bbf3d228f443e3ca4d62b59aca84e990cacaf5c5"
            "2b0930daa23de94ce87017ba2d84988ddfc9c58db67aada613c2dd08457941a6");
}

TEST(CryptoTest, TamperedOrMisroutedCiphertextsAreRejected) {
  const Bytes key(32, 'k'), other(32, 'o'), nonce(12, 'n');
  const Bytes aad = "run r1 | round 3 | from c1 to c2";
  const Bytes sealed = *AeadSeal(key, nonce, aad, "share of c1 for c2");
  EXPECT_EQ(*AeadOpen(key, nonce, aad, sealed), "share of c1 for c2");
  Bytes flipped = sealed;
  flipped[3] ^= 1;
  EXPECT_FALSE(AeadOpen(key, nonce, aad, flipped).ok());
  flipped = sealed;
  flipped.back() ^= 1;  // the tag
  EXPECT_FALSE(AeadOpen(key, nonce, aad, flipped).ok());
  EXPECT_FALSE(AeadOpen(key, nonce, "run r1 | round 3 | from c1 to c3", sealed).ok()) << "misrouted";
  EXPECT_FALSE(AeadOpen(key, nonce, "run r1 | round 4 | from c1 to c2", sealed).ok()) << "replayed";
  EXPECT_FALSE(AeadOpen(other, nonce, aad, sealed).ok());
  EXPECT_FALSE(AeadOpen(key, nonce, aad, sealed.substr(0, 10)).ok());
}

TEST(CryptoTest, MaskPrgIsDeterministicUniformAndUnbiased) {
  const Bytes seed(32, 's');
  const std::vector<uint64_t> a = MaskPrg(seed, 1000003, 50000).value();
  EXPECT_EQ(a, MaskPrg(seed, 1000003, 50000).value());
  EXPECT_NE(a, *MaskPrg(Bytes(32, 't'), 1000003, 50000));
  double mean = 0;
  for (uint64_t v : a) {
    ASSERT_LT(v, 1000003u);
    mean += static_cast<double>(v) / a.size();
  }
  // Uniform on [0, m): mean (m - 1) / 2, standard error m / sqrt(12 n).
  EXPECT_NEAR(mean, 500001, 5 * 1000003 / std::sqrt(12.0 * 50000));
  // A small modulus that is not a power of two: each residue about equally often.
  const std::vector<uint64_t> small = MaskPrg(seed, 3, 30000).value();
  std::map<uint64_t, int> counts;
  for (uint64_t v : small) ++counts[v];
  ASSERT_EQ(counts.size(), 3u);
  for (const auto& [v, c] : counts) EXPECT_NEAR(c, 10000, 5 * std::sqrt(30000 * 2.0 / 9)) << v;
  const std::vector<uint64_t> pow2 = MaskPrg(seed, uint64_t{1} << 32, 1000).value();
  for (uint64_t v : pow2) ASSERT_LT(v, uint64_t{1} << 32);
}

TEST(CryptoTest, ShamirRecoversFromAnyTSharesAndNotFromFewer) {
  const Bytes secret = Hex("00112233445566778899aabbccddeeff0123456789abcdeffedcba9876543210");
  const int t = 4, n = 7;
  auto shares = *ShamirSplit(secret, t, n);
  ASSERT_EQ(shares.size(), 7u);
  // Every 4-subset of the 7 shares.
  int subsets = 0;
  for (int mask = 0; mask < (1 << n); ++mask) {
    if (__builtin_popcount(mask) != t) continue;
    std::vector<Share> pick;
    for (int i = 0; i < n; ++i) {
      if (mask >> i & 1) pick.push_back(shares[i]);
    }
    ASSERT_EQ(*ShamirCombine(pick, t, secret.size()), secret) << mask;
    ++subsets;
  }
  EXPECT_EQ(subsets, 35);
  // t - 1 shares: refused as such, and interpolating them as if t - 1 sufficed does not
  // give the secret.
  std::vector<Share> few(shares.begin(), shares.begin() + t - 1);
  EXPECT_EQ(ShamirCombine(few, t, secret.size()).status().code(), absl::StatusCode::kFailedPrecondition);
  auto wrong = ShamirCombine(few, t - 1, secret.size());
  EXPECT_TRUE(!wrong.ok() || *wrong != secret);
  // A tampered share gives another value (or none), never silently the secret.
  auto bad = std::vector<Share>(shares.begin(), shares.begin() + t);
  bad[0].y[0] ^= 1;
  auto tampered = ShamirCombine(bad, t, secret.size());
  EXPECT_TRUE(!tampered.ok() || *tampered != secret);
  bad = std::vector<Share>(shares.begin(), shares.begin() + t);
  bad[1].x = bad[0].x;
  EXPECT_EQ(ShamirCombine(bad, t, secret.size()).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ShamirSplit(secret, 0, 3).ok());
  EXPECT_FALSE(ShamirSplit(secret, 4, 3).ok());
}

}  // namespace
}  // namespace cleave::crypto
