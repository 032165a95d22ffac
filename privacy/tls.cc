#include "privacy/tls.h"

#include "absl/strings/ascii.h"
#include "core/files.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

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

StatusOr<std::string> ReadBearerToken(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::string token(absl::StripAsciiWhitespace(text));
  if (token.empty()) return absl::InvalidArgumentError(path + " holds no token");
  return token;
}

}  // namespace cleave
