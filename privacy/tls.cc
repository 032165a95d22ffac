#include "privacy/tls.h"

#include "absl/strings/ascii.h"
#include "core/files.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/server_context.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace cleave {

std::shared_ptr<grpc::ChannelCredentials> ClientCredentials(const std::string& ca,
                                                            const std::string& cert,
                                                            const std::string& key,
                                                            unsigned reload_s,
                                                            const std::string& token) {
  if (ca.empty()) return grpc::InsecureChannelCredentials();
  auto provider =
      cert.empty()
          ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(ca, reload_s)
          : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(key, cert, ca,
                                                                                 reload_s);
  grpc::experimental::TlsChannelCredentialsOptions o;
  o.set_certificate_provider(provider);
  o.watch_root_certs();
  if (!cert.empty()) o.watch_identity_key_cert_pairs();
  o.set_verify_server_certs(true);
  auto tls = grpc::experimental::TlsCredentials(o);
  if (token.empty()) return tls;
  return grpc::CompositeChannelCredentials(tls, grpc::AccessTokenCredentials(token));
}

std::shared_ptr<grpc::ServerCredentials> PeerServerCredentials(const std::string& ca,
                                                               const std::string& cert,
                                                               const std::string& key,
                                                               unsigned reload_s) {
  if (ca.empty()) return grpc::InsecureServerCredentials();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      key, cert, ca, reload_s);
  grpc::experimental::TlsServerCredentialsOptions o(provider);
  o.watch_root_certs();
  o.watch_identity_key_cert_pairs();
  o.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(o);
}

namespace {

// The reason OpenSSL gave for the last failure, or `fallback`.
std::string OpenSslReason(const char* fallback) {
  const unsigned long e = ERR_peek_last_error();
  ERR_clear_error();
  if (e == 0) return fallback;
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;
Bio MemBio(const std::string& s) {
  return Bio(BIO_new_mem_buf(s.data(), static_cast<int>(s.size())), &BIO_free);
}

// The certificates in PEM text `pem`; an error unless there is at least one and all parse.
StatusOr<std::vector<std::unique_ptr<X509, decltype(&X509_free)>>> ParseCerts(
    const std::string& key, const std::string& path, const std::string& pem) {
  std::vector<std::unique_ptr<X509, decltype(&X509_free)>> certs;
  Bio bio = MemBio(pem);
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    certs.emplace_back(x, &X509_free);
  }
  const unsigned long e = ERR_peek_last_error();
  // Reading stops at the end with PEM_R_NO_START_LINE; anything else is a broken file.
  if (e != 0 && !(ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE)) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": ", path, " holds a malformed certificate (", OpenSslReason(""), ")"));
  }
  ERR_clear_error();
  if (certs.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, ": ", path, " holds no PEM certificate"));
  }
  return certs;
}

StatusOr<std::string> ReadNamed(const std::string& key, const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat(key, ": cannot read ", path));
  return text;
}

}  // namespace

StatusOr<TlsMaterial> ReadServerTls(const std::string& cert, const std::string& key,
                                    const std::string& ca) {
  TlsMaterial m;
  ASSIGN_OR_RETURN(m.cert_chain, ReadNamed("tls.cert", cert));
  ASSIGN_OR_RETURN(m.key, ReadNamed("tls.key", key));
  ASSIGN_OR_RETURN(auto chain, ParseCerts("tls.cert", cert, m.cert_chain));
  Bio bio = MemBio(m.key);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr), &EVP_PKEY_free);
  if (!pkey) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls.key: ", key, " holds no usable PEM private key (", OpenSslReason("unreadable"), ")"));
  }
  if (X509_check_private_key(chain[0].get(), pkey.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("tls.key: ", key,
                                                   " does not match the certificate in ", cert));
  }
  if (!ca.empty()) {
    ASSIGN_OR_RETURN(m.ca, ReadNamed("tls.ca", ca));
    RETURN_IF_ERROR(ParseCerts("tls.ca", ca, m.ca).status());
  }
  return m;
}

StatusOr<std::set<std::string>> ReadRevocationList(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadNamed("tls.revoked", path));
  std::set<std::string> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::string name(absl::StripAsciiWhitespace(line));
    if (!name.empty() && name[0] != '#') out.insert(std::move(name));
  }
  return out;
}

StatusOr<std::string> ReadBearerToken(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::string token(absl::StripAsciiWhitespace(text));
  if (token.empty()) return absl::InvalidArgumentError(path + " holds no token");
  return token;
}

std::string PeerCommonName(const grpc::ServerContextBase& ctx) {
  const auto auth = ctx.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return "";
  const auto cn = auth->FindPropertyValues("x509_common_name");
  return cn.empty() ? "" : std::string(cn[0].data(), cn[0].size());
}

}  // namespace cleave
