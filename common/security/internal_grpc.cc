#include "common/security/internal_grpc.h"

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/client_interceptor.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/security/cluster_credential.h"

namespace moeshard {
namespace {

struct InstalledSecurity {
  std::string token;
  bool tls = false;
  std::string cert_pem, key_pem, ca_pem;
};

// Never destroyed: gRPC's threads read the token until the process ends, and a static object's
// destructor would free it under them at exit (internal_service_fuzz's generate seed caught a
// heap-use-after-free there: libFuzzer exits while the harness's servers still run).
InstalledSecurity& Installed() {
  static InstalledSecurity* s = new InstalledSecurity;
  return *s;
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (ss.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is not a PEM file"));
  }
  return ss.str();
}

// Adds the cluster credential to the initial metadata of every call on its channel.
class CredentialInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit CredentialInterceptor(const std::string* token) : token_(token) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({kClusterTokenMetadataKey, *token_});
    }
    methods->Proceed();
  }

 private:
  const std::string* token_;
};

class CredentialInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateClientInterceptor(grpc::experimental::ClientRpcInfo*) override {
    return new CredentialInterceptor(&Installed().token);
  }
};

}  // namespace

absl::Status ConfigureInternalSecurity(const InternalSecurityOptions& options) {
  if (options.token.size() < kMinClusterTokenChars) {
    return absl::InvalidArgumentError(absl::StrCat("the cluster credential needs at least ", kMinClusterTokenChars, " characters"));
  }
  InstalledSecurity s;
  s.token = options.token;
  const int num_tls = !options.tls_cert_file.empty() + !options.tls_key_file.empty() + !options.tls_ca_file.empty();
  if (num_tls != 0 && num_tls != 3) {
    return absl::InvalidArgumentError("mutual TLS needs all of --internal-tls-cert, --internal-tls-key and --internal-tls-ca");
  }
  if (num_tls == 3) {
    auto cert = ReadPem(options.tls_cert_file, "--internal-tls-cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(options.tls_key_file, "--internal-tls-key");
    if (!key.ok()) return key.status();
    auto ca = ReadPem(options.tls_ca_file, "--internal-tls-ca");
    if (!ca.ok()) return ca.status();
    s.tls = true;
    s.cert_pem = *std::move(cert);
    s.key_pem = *std::move(key);
    s.ca_pem = *std::move(ca);
  }
  Installed() = std::move(s);
  return absl::OkStatus();
}

absl::Status ConfigureInternalSecurityFromFlags(const std::string& token_file, const std::string& tls_cert_file,
                                                const std::string& tls_key_file, const std::string& tls_ca_file) {
  auto token = LoadClusterToken(token_file);
  if (!token.ok()) return token.status();
  return ConfigureInternalSecurity({*token, tls_cert_file, tls_key_file, tls_ca_file});
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentials(const std::string& cert_file,
                                                                              const std::string& key_file) {
  auto cert = ReadPem(cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(key_file, "--tls-key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions o;
  o.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(o);
}

bool InternalAuthEnabled() { return !Installed().token.empty(); }

std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials() {
  const InstalledSecurity& s = Installed();
  if (!s.tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = s.ca_pem;
  o.pem_key_cert_pairs.push_back({s.key_pem, s.cert_pem});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::Channel> CreateInternalChannel(const std::string& address, const grpc::ChannelArguments& args) {
  const InstalledSecurity& s = Installed();
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (s.tls) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = s.ca_pem;
    o.pem_private_key = s.key_pem;
    o.pem_cert_chain = s.cert_pem;
    creds = grpc::SslCredentials(o);
  }
  if (s.token.empty()) return grpc::CreateCustomChannel(address, creds, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<CredentialInterceptorFactory>());
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, creds, args, std::move(interceptors));
}

bool ClusterBearerAuthorized(std::string_view authorization) {
  const std::string& token = Installed().token;
  return token.empty() || BearerEquals(authorization, token);
}

grpc::Status CheckClusterCredential(const grpc::ServerContext* context) {
  const std::string& token = Installed().token;
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kClusterTokenMetadataKey);
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "this internal service needs the cluster credential");
  }
  if (!SecretEquals(std::string_view(it->second.data(), it->second.size()), token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong cluster credential");
  }
  return grpc::Status::OK;
}

}  // namespace moeshard
