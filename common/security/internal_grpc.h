// Authentication of the internal gRPC services (worker, coordinator and its store): every
// call carries the cluster credential in its metadata (a client interceptor on the
// channels made here adds it), and every handler starts with CheckClusterCredential, which
// answers UNAUTHENTICATED before the handler reads its request. Optionally the transport is
// mutual TLS (certificate, key and the CA that signs both sides, by flag), for networks
// that are not trusted; the token is checked over TLS too.
//
// Configured once per process at start-up, before any server or channel exists; read-only
// afterwards, so every function here is thread-safe once configured. A process that never
// configures (in-process tests) uses plaintext and checks nothing; the binaries refuse to
// start without a credential (cli/internal_security_flags.h).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moeshard {

struct InternalSecurityOptions {
  std::string token;  // the cluster credential (cluster_credential.h)
  // Mutual TLS: all three PEM files, or none (plaintext).
  std::string tls_cert_file, tls_key_file, tls_ca_file;
};

// Validates and installs `options` for this process; reads the certificate files.
absl::Status ConfigureInternalSecurity(const InternalSecurityOptions& options);

// What each internal binary calls first: the cluster credential from the environment or
// `token_file` (LoadClusterToken), and the mutual-TLS files when given.
absl::Status ConfigureInternalSecurityFromFlags(const std::string& token_file, const std::string& tls_cert_file,
                                                const std::string& tls_key_file, const std::string& tls_ca_file);
inline constexpr char kInternalSecurityUsage[] =
    "[--cluster-token-file FILE] [--internal-tls-cert PEM --internal-tls-key PEM --internal-tls-ca PEM]\n"
    "       (the cluster credential: $MOESHARD_CLUSTER_TOKEN or a file; `moeshard up` makes one)";

// True once a credential is installed.
bool InternalAuthEnabled();

// For the internal HTTP ports (coordinator and worker /metrics): true when `authorization`
// (the HTTP header) is "Bearer <cluster credential>", or no credential is installed.
bool ClusterBearerAuthorized(std::string_view authorization);

// Server-side TLS (no client certificate) from PEM files: the router's public gRPC port.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsServerCredentials(const std::string& cert_file,
                                                                              const std::string& key_file);

// Credentials for the internal servers' listening ports.
std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials();

// A channel to an internal service that attaches the cluster credential to every call.
std::shared_ptr<grpc::Channel> CreateInternalChannel(const std::string& address, const grpc::ChannelArguments& args);

// OK when the call carries the cluster credential (or none is configured); otherwise
// UNAUTHENTICATED, with a message that echoes nothing the caller sent.
grpc::Status CheckClusterCredential(const grpc::ServerContext* context);

}  // namespace moeshard
