// The one mapping of status codes between absl::Status (inside every process), grpc::Status (the
// services' edge) and HTTP (the router's OpenAI API). absl's and gRPC's codes are both
// google.rpc.Code, so absl <-> gRPC keeps the code and the message as they are; HTTP follows
// google.rpc.Code's HTTP mapping:
//
//   InvalidArgument, OutOfRange, FailedPrecondition -> 400    Unauthenticated   -> 401
//   PermissionDenied -> 403    NotFound -> 404                 ResourceExhausted -> 429
//   Unavailable -> 503         DeadlineExceeded -> 504         OK -> 200, anything else -> 500
//
// Pure functions; safe from any thread.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace moeshard {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);
int HttpStatusCode(absl::StatusCode code);

}  // namespace moeshard
