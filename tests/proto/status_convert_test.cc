// The one status mapping (proto/status_convert.h): absl <-> gRPC keeps every code and the
// message; HTTP follows google.rpc.Code's table; the router's OpenAI error bodies use it.
#include "proto/status_convert.h"

#include <map>

#include "gtest/gtest.h"
#include "router/api_error.h"

namespace moeshard {
namespace {

TEST(StatusConvertTest, GrpcRoundTripKeepsCodeAndMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  for (int c = 1; c <= 16; ++c) {
    const absl::Status st(static_cast<absl::StatusCode>(c), "why " + std::to_string(c));
    const grpc::Status g = ToGrpcStatus(st);
    EXPECT_EQ(static_cast<int>(g.error_code()), c);
    EXPECT_EQ(g.error_message(), "why " + std::to_string(c));
    EXPECT_EQ(FromGrpcStatus(g), st);
  }
  EXPECT_EQ(ToGrpcStatus(absl::ResourceExhaustedError("full")).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(ToGrpcStatus(absl::DeadlineExceededError("late")).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "down")), absl::UnavailableError("down"));
}

TEST(StatusConvertTest, HttpStatusOfEveryCode) {
  const std::map<absl::StatusCode, int> want = {
      {absl::StatusCode::kOk, 200},
      {absl::StatusCode::kCancelled, 500},
      {absl::StatusCode::kUnknown, 500},
      {absl::StatusCode::kInvalidArgument, 400},
      {absl::StatusCode::kDeadlineExceeded, 504},
      {absl::StatusCode::kNotFound, 404},
      {absl::StatusCode::kAlreadyExists, 500},
      {absl::StatusCode::kPermissionDenied, 403},
      {absl::StatusCode::kResourceExhausted, 429},
      {absl::StatusCode::kFailedPrecondition, 400},
      {absl::StatusCode::kAborted, 500},
      {absl::StatusCode::kOutOfRange, 400},
      {absl::StatusCode::kUnimplemented, 500},
      {absl::StatusCode::kInternal, 500},
      {absl::StatusCode::kUnavailable, 503},
      {absl::StatusCode::kDataLoss, 500},
      {absl::StatusCode::kUnauthenticated, 401},
  };
  for (const auto& [code, http] : want) EXPECT_EQ(HttpStatusCode(code), http) << absl::StatusCodeToString(code);
}

TEST(StatusConvertTest, OpenAiErrorBodiesFollowTheMapping) {
  router::HttpError e = router::ToHttpError(absl::UnavailableError("no pool"));
  EXPECT_EQ(e.http_status, 503);
  EXPECT_EQ(e.body["error"]["type"], "service_unavailable_error");
  EXPECT_EQ(e.body["error"]["code"], "service_unavailable");
  e = router::ToHttpError(absl::UnauthenticatedError("key"));
  EXPECT_EQ(e.http_status, 401);
  EXPECT_EQ(e.body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e.body["error"]["code"], "invalid_api_key");
  e = router::ToHttpError(router::InvalidParam("max_tokens", "too many", "context_length_exceeded"));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e.body["error"]["param"], "max_tokens");
  EXPECT_EQ(e.body["error"]["code"], "context_length_exceeded");
  e = router::ToHttpError(absl::ResourceExhaustedError("queue"));
  EXPECT_EQ(e.http_status, 429);
  EXPECT_EQ(e.body["error"]["type"], "rate_limit_error");
  e = router::ToHttpError(absl::DeadlineExceededError("slow"));
  EXPECT_EQ(e.http_status, 504);
  EXPECT_EQ(e.body["error"]["type"], "server_error");
  EXPECT_TRUE(e.body["error"]["code"].is_null());
  e = router::ToHttpError(absl::InternalError("bug"));
  EXPECT_EQ(e.http_status, 500);
  EXPECT_EQ(e.body["error"]["type"], "server_error");
}

}  // namespace
}  // namespace moeshard
