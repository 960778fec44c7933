// The router's gRPC API: moeshard.v1.Inference/Generate (server streaming, the same
// generation as POST /v1/completions) and grpc.health.v1.Health, SERVING while a pool is
// ready (the health service needs no API key, so that probes work). Errors leave through
// one conversion: absl::Status -> grpc::Status.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "proto/moeshard.grpc.pb.h"
#include "router/generation.h"

namespace moeshard::router {

// GenerateRequest -> typed parameters (the gRPC defaults: temperature 0 = greedy,
// max_tokens 0 = fill the context, top_k 0 and top_p 0 = off).
absl::StatusOr<CompletionRequest> FromProto(const v1::GenerateRequest& request);

class InferenceService final : public v1::Inference::Service {
 public:
  // `api_key` non-empty: calls need the metadata "authorization: Bearer <key>".
  InferenceService(const RouterServices& services, std::string api_key)
      : services_(services), api_key_(std::move(api_key)) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;

 private:
  const RouterServices& services_;
  const std::string api_key_;
};

class GrpcServer {
 public:
  GrpcServer(const RouterServices& services, std::string api_key) : service_(services, std::move(api_key)) {}
  ~GrpcServer();

  // Listens on host:port (0 = a free port), with TLS when both PEM files are given; returns
  // the bound port.
  absl::StatusOr<int> Start(const std::string& host, int port, const std::string& tls_cert_file = "",
                            const std::string& tls_key_file = "");
  void SetServing(bool serving);
  // Cancels the calls still running after `grace` and stops.
  void Stop(absl::Duration grace);

 private:
  InferenceService service_;
  std::mutex mu_;  // guards server_: SetServing comes from other threads
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace moeshard::router
