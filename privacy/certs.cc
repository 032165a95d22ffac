#include "privacy/certs.h"

#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/files.h"
#include "privacy/tls.h"

namespace cleave {
namespace {

namespace fs = std::filesystem;

template <typename T, void (*F)(T*)>
struct Deleter {
  void operator()(T* p) const { F(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;

Status OpenSslError(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, " failed (OpenSSL)"));
}

StatusOr<Key> NewKey() {
  Key key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!key) return OpenSslError("P-256 key generation");
  return key;
}

Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return OpenSslError(absl::StrCat("extension ", OBJ_nid2sn(nid), " = ", value));
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return ok ? absl::OkStatus() : OpenSslError("adding an extension");
}

// A certificate for `key` named `cn`, signed by `issuer_key` (self-signed when `issuer`
// is null), with the given extensions.
StatusOr<Cert> MakeCert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key,
                        int days, const std::vector<std::pair<int, std::string>>& extensions) {
  Cert cert(X509_new());
  if (!cert || !X509_set_version(cert.get(), 2)) return OpenSslError("X509_new");
  // A random positive 159-bit serial number.
  unsigned char serial[20];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpenSslError("RAND_bytes");
  serial[0] &= 0x7f;
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  const bool serial_ok = bn != nullptr && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  if (!serial_ok) return OpenSslError("serial number");
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -300);  // tolerate small clock skew
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name);
  if (!X509_set_pubkey(cert.get(), key)) return OpenSslError("X509_set_pubkey");
  X509* signer = issuer ? issuer : cert.get();
  for (const auto& [nid, value] : extensions) {
    RETURN_IF_ERROR(AddExtension(cert.get(), signer, nid, value));
  }
  if (!X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256())) {
    return OpenSslError("X509_sign");
  }
  return cert;
}

// What `write` puts into a memory BIO.
template <typename Write>
std::string Pem(Write write) {
  BIO* bio = BIO_new(BIO_s_mem());
  write(bio);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, n);
  BIO_free(bio);
  return pem;
}

std::string KeyPem(EVP_PKEY* key) {
  return Pem([&](BIO* b) { PEM_write_bio_PrivateKey(b, key, nullptr, nullptr, 0, nullptr, nullptr); });
}

std::string CertPem(X509* cert) {
  return Pem([&](BIO* b) { PEM_write_bio_X509(b, cert); });
}

// Writes a private key readable by its owner only (0600 from the start: it is never
// world-readable, not even briefly).
Status WritePrivateKey(const fs::path& path, EVP_PKEY* key) {
  const mode_t old = umask(077);
  Status s = WriteFileAtomic(path.string(), KeyPem(key));
  umask(old);
  RETURN_IF_ERROR(s);
  if (chmod(path.c_str(), 0600) != 0) {
    return absl::InternalError(absl::StrCat("chmod 0600 ", path.string()));
  }
  return absl::OkStatus();
}

StatusOr<Key> ReadKey(const fs::path& path) {
  ASSIGN_OR_RETURN(std::string pem, ReadFile(path.string()));
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  Key key(PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr));
  BIO_free(bio);
  if (!key) return absl::InvalidArgumentError(absl::StrCat(path.string(), " is not a private key"));
  return key;
}

StatusOr<Cert> ReadCert(const fs::path& path) {
  ASSIGN_OR_RETURN(std::string pem, ReadFile(path.string()));
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  Cert cert(PEM_read_bio_X509(bio, nullptr, nullptr, nullptr));
  BIO_free(bio);
  if (!cert) return absl::InvalidArgumentError(absl::StrCat(path.string(), " is not a certificate"));
  return cert;
}

std::string SanList(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) {
    const bool ip = n.find_first_not_of("0123456789.") == std::string::npos ||
                    n.find(':') != std::string::npos;
    absl::StrAppend(&out, out.empty() ? "" : ",", ip ? "IP:" : "DNS:", n);
  }
  return out;
}

}  // namespace

Status RevokeClient(const std::string& dir, const std::string& name) {
  if (!ValidClientName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a client name"));
  }
  const std::string path = dir + "/revoked.txt";
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    ASSIGN_OR_RETURN(std::set<std::string> revoked, ReadRevocationList(path));
    if (revoked.count(name)) return absl::OkStatus();
  }
  return AppendLine(path, name);
}

bool ValidClientName(const std::string& name) {
  if (name.empty() || name.size() > 64 || name[0] == '.') return false;
  return name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") ==
         std::string::npos;
}

Status InitFederation(const std::string& dir, const CertOptions& o) {
  const fs::path d(dir);
  if (fs::exists(d / "ca.key") || fs::exists(d / "ca.crt")) {
    return absl::AlreadyExistsError(absl::StrCat(dir, " already holds a federation CA"));
  }
  if (o.server_names.empty()) return absl::InvalidArgumentError("the server needs a name");
  std::error_code ec;
  fs::create_directories(d / "clients", ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", dir, ": ", ec.message()));
  ASSIGN_OR_RETURN(Key ca_key, NewKey());
  ASSIGN_OR_RETURN(Cert ca, MakeCert(ca_key.get(), o.federation + " federation CA", nullptr,
                                     nullptr, o.ca_days,
                                     {{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                                      {NID_key_usage, "critical,keyCertSign,cRLSign"},
                                      {NID_subject_key_identifier, "hash"}}));
  ASSIGN_OR_RETURN(Key server_key, NewKey());
  ASSIGN_OR_RETURN(Cert server, MakeCert(server_key.get(), o.server_names[0], ca.get(),
                                         ca_key.get(), o.leaf_days,
                                         {{NID_basic_constraints, "critical,CA:FALSE"},
                                          {NID_key_usage, "critical,digitalSignature"},
                                          {NID_ext_key_usage, "serverAuth"},
                                          {NID_subject_alt_name, SanList(o.server_names)},
                                          {NID_authority_key_identifier, "keyid"}}));
  RETURN_IF_ERROR(WritePrivateKey(d / "ca.key", ca_key.get()));
  RETURN_IF_ERROR(WriteFileAtomic((d / "ca.crt").string(), CertPem(ca.get())));
  RETURN_IF_ERROR(WritePrivateKey(d / "server.key", server_key.get()));
  return WriteFileAtomic((d / "server.crt").string(), CertPem(server.get()));
}

Status IssueClientCert(const std::string& dir, const std::string& name, const CertOptions& o) {
  if (!ValidClientName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client name '", name, "': use 1-64 characters of A-Z a-z 0-9 . _ - (not a leading .)"));
  }
  const fs::path d(dir);
  const fs::path crt = d / "clients" / (name + ".crt"), key_path = d / "clients" / (name + ".key");
  if (fs::exists(crt) || fs::exists(key_path)) {
    return absl::AlreadyExistsError(absl::StrCat("client ", name, " already has a certificate in ", dir));
  }
  ASSIGN_OR_RETURN(Key ca_key, ReadKey(d / "ca.key"));
  ASSIGN_OR_RETURN(Cert ca, ReadCert(d / "ca.crt"));
  std::error_code ec;
  fs::create_directories(d / "clients", ec);
  ASSIGN_OR_RETURN(Key key, NewKey());
  // Also a server certificate for NAME.peer.cleave: in gossip rounds a client serves
  // Peer to its neighbours, who verify it under that name (docs/security.md).
  ASSIGN_OR_RETURN(Cert cert, MakeCert(key.get(), name, ca.get(), ca_key.get(), o.leaf_days,
                                       {{NID_basic_constraints, "critical,CA:FALSE"},
                                        {NID_key_usage, "critical,digitalSignature"},
                                        {NID_ext_key_usage, "clientAuth,serverAuth"},
                                        {NID_subject_alt_name, "DNS:" + name + kPeerNameSuffix},
                                        {NID_authority_key_identifier, "keyid"}}));
  RETURN_IF_ERROR(WritePrivateKey(key_path, key.get()));
  return WriteFileAtomic(crt.string(), CertPem(cert.get()));
}

}  // namespace cleave
