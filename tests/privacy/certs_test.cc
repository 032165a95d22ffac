#include "privacy/certs.h"
#include "privacy/tls.h"

#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <filesystem>
#include <set>
#include <memory>

#include "core/files.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
using CertPtr = std::unique_ptr<X509, X509Free>;

CertPtr Load(const fs::path& path) {
  const std::string pem = *ReadFile(path.string());
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  CertPtr c(PEM_read_bio_X509(bio, nullptr, nullptr, nullptr));
  BIO_free(bio);
  return c;
}

// OpenSSL's own verdict on `leaf` against the CA at `ca` for `purpose`.
int Verify(const fs::path& ca, const fs::path& leaf, int purpose) {
  CertPtr root = Load(ca), cert = Load(leaf);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, root.get());
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, cert.get(), nullptr);
  X509_STORE_CTX_set_purpose(ctx, purpose);
  const int ok = X509_verify_cert(ctx);
  const int err = ok == 1 ? X509_V_OK : X509_STORE_CTX_get_error(ctx);
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  return err;
}

std::string CommonName(X509* c) {
  char buf[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(c), NID_commonName, buf, sizeof(buf));
  return buf;
}

class CertsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("cleave-certs-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

mode_t Mode(const fs::path& p) {
  struct stat st;
  stat(p.c_str(), &st);
  return st.st_mode & 0777;
}

TEST_F(CertsTest, InitAndIssueMakeAVerifiableFederation) {
  CertOptions o;
  o.server_names = {"coordinator.example", "10.0.0.7"};
  ASSERT_TRUE(InitFederation(dir_.string(), o).ok());
  ASSERT_TRUE(IssueClientCert(dir_.string(), "phone-17").ok());
  for (const char* key : {"ca.key", "server.key", "clients/phone-17.key"}) {
    EXPECT_EQ(Mode(dir_ / key), 0600u) << key;
  }
  EXPECT_EQ(Verify(dir_ / "ca.crt", dir_ / "server.crt", X509_PURPOSE_SSL_SERVER), X509_V_OK);
  EXPECT_EQ(Verify(dir_ / "ca.crt", dir_ / "clients/phone-17.crt", X509_PURPOSE_SSL_CLIENT),
            X509_V_OK);
  // The server's leaf is a server's only; a client's also serves Peer to its gossip
  // neighbours, under NAME.peer.cleave alone (never a coordinator's hostname).
  EXPECT_NE(Verify(dir_ / "ca.crt", dir_ / "server.crt", X509_PURPOSE_SSL_CLIENT), X509_V_OK);
  EXPECT_EQ(Verify(dir_ / "ca.crt", dir_ / "clients/phone-17.crt", X509_PURPOSE_SSL_SERVER),
            X509_V_OK);
  {
    CertPtr c = Load(dir_ / "clients/phone-17.crt");
    EXPECT_EQ(X509_check_host(c.get(), "phone-17.peer.cleave", 0, 0, nullptr), 1);
    EXPECT_NE(X509_check_host(c.get(), "phone-17", 0, 0, nullptr), 1);
    EXPECT_NE(X509_check_host(c.get(), "coordinator.example", 0, 0, nullptr), 1);
  }

  CertPtr client = Load(dir_ / "clients/phone-17.crt");
  EXPECT_EQ(CommonName(client.get()), "phone-17");
  EVP_PKEY* pub = X509_get0_pubkey(client.get());
  EXPECT_EQ(EVP_PKEY_get_base_id(pub), EVP_PKEY_EC);
  char group[64] = {};
  size_t len = 0;
  EVP_PKEY_get_group_name(pub, group, sizeof(group), &len);
  EXPECT_STREQ(group, "prime256v1");
  CertPtr server = Load(dir_ / "server.crt");
  EXPECT_EQ(X509_check_host(server.get(), "coordinator.example", 0, 0, nullptr), 1);
  EXPECT_EQ(X509_check_ip_asc(server.get(), "10.0.0.7", 0), 1);
  EXPECT_NE(X509_check_host(server.get(), "evil.example", 0, 0, nullptr), 1);
  // Validity: the leaf for 397 days, not a decade.
  int days = 0, secs = 0;
  ASN1_TIME_diff(&days, &secs, X509_get0_notBefore(client.get()), X509_get0_notAfter(client.get()));
  EXPECT_GE(days, 397);
  EXPECT_LE(days, 398);
}

TEST_F(CertsTest, AnotherFederationsCertificateDoesNotVerify) {
  ASSERT_TRUE(InitFederation(dir_.string()).ok());
  const fs::path other = dir_ / "other";
  ASSERT_TRUE(InitFederation(other.string()).ok());
  ASSERT_TRUE(IssueClientCert(other.string(), "mallory").ok());
  EXPECT_NE(Verify(dir_ / "ca.crt", other / "clients/mallory.crt", X509_PURPOSE_SSL_CLIENT),
            X509_V_OK);
}

TEST_F(CertsTest, NothingIsSilentlyReplacedAndBadNamesAreRefused) {
  ASSERT_TRUE(InitFederation(dir_.string()).ok());
  const std::string ca = *ReadFile((dir_ / "ca.crt").string());
  EXPECT_EQ(InitFederation(dir_.string()).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*ReadFile((dir_ / "ca.crt").string()), ca);
  ASSERT_TRUE(IssueClientCert(dir_.string(), "a").ok());
  EXPECT_EQ(IssueClientCert(dir_.string(), "a").code(), absl::StatusCode::kAlreadyExists);
  for (const std::string& bad : std::vector<std::string>{"", "../server", ".hidden", "a/b", "x y", std::string(65, 'n')}) {
    EXPECT_EQ(IssueClientCert(dir_.string(), bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(fs::exists(dir_ / "server.crt.key"));
  EXPECT_EQ(IssueClientCert((dir_ / "missing").string(), "b").code(), absl::StatusCode::kNotFound);
}

TEST_F(CertsTest, RevokeAppendsTheNameOnce) {
  ASSERT_TRUE(InitFederation(dir_.string()).ok());
  ASSERT_TRUE(RevokeClient(dir_.string(), "dev-3").ok());
  ASSERT_TRUE(RevokeClient(dir_.string(), "dev-7").ok());
  ASSERT_TRUE(RevokeClient(dir_.string(), "dev-3").ok());
  EXPECT_EQ(*ReadFile((dir_ / "revoked.txt").string()), "dev-3\ndev-7\n");
  auto list = ReadRevocationList((dir_ / "revoked.txt").string());
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, (std::set<std::string>{"dev-3", "dev-7"}));
  EXPECT_EQ(RevokeClient(dir_.string(), "../x").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cleave
