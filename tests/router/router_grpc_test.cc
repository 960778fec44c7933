// The router's gRPC API against a fake coordinator: Inference/Generate (text and ids,
// stop strings, errors, cancellation, the API key) and the grpc.health.v1 service.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/moeshard.grpc.pb.h"
#include "router/auth.h"
#include "router_test_util.h"

namespace moeshard::router::testing {
namespace {

using ::testing::HasSubstr;

class RouterGrpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(h_.WaitReady());
    channel_ =
        grpc::CreateChannel("127.0.0.1:" + std::to_string(h_.router().grpc_port()), grpc::InsecureChannelCredentials());
    stub_ = v1::Inference::NewStub(channel_);
  }

  struct Collected {
    std::vector<v1::GenerateResponse> messages;
    std::string text;
    grpc::Status status;
  };

  Collected Generate(const v1::GenerateRequest& request) {
    Collected c;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto reader = stub_->Generate(&ctx, request);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      c.text += r.text();
      c.messages.push_back(r);
    }
    c.status = reader->Finish();
    return c;
  }

  // grpc.health.v1.Health/Check for the whole server, without the health proto's stubs:
  // the request (service "") is empty, the reply is field 1 (status) as a varint.
  int HealthStatus() {
    grpc::GenericStub generic(channel_);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::CompletionQueue cq;
    grpc::ByteBuffer request, reply;
    grpc::Slice empty;
    request = grpc::ByteBuffer(&empty, 1);
    auto call = generic.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
    call->StartCall();
    grpc::Status status;
    call->Finish(&reply, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok) || !ok || !status.ok()) return -1;
    std::vector<grpc::Slice> slices;
    if (!reply.Dump(&slices).ok()) return -1;
    std::string bytes;
    for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    if (bytes.empty()) return 0;  // UNKNOWN is the default, sent as nothing
    return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -1;
  }

  bool WaitHealth(int expected) {
    for (int i = 0; i < 500; ++i) {
      if (HealthStatus() == expected) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  RouterHarness h_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(RouterGrpcTest, GenerateFromText) {
  v1::GenerateRequest req;
  req.set_prompt("hello");
  req.set_max_tokens(4);
  req.set_request_id("grpc-req-1");
  Collected c = Generate(req);
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  ASSERT_GE(c.messages.size(), 2u);
  EXPECT_EQ(c.messages.front().prompt_ids_size(), 5);
  EXPECT_EQ(c.messages.front().request_id(), "grpc-req-1");
  EXPECT_EQ(c.text, "hell");
  int num_tokens = 0;
  for (const auto& m : c.messages) num_tokens += m.tokens_size();
  EXPECT_EQ(num_tokens, 4);
  const v1::GenerateResponse& last = c.messages.back();
  EXPECT_EQ(last.finish_reason(), "length");
  EXPECT_EQ(last.usage().prompt_tokens(), 5);
  EXPECT_EQ(last.usage().completion_tokens(), 4);
  EXPECT_EQ(h_.fake().last_request().request_id(), "grpc-req-1");
  EXPECT_EQ(h_.fake().last_request().sampling().temperature(), 0.0f);  // the proto default: greedy
}

// As /v1/completions: special-token text in a text prompt is plain text unless the request
// sets allow_special_tokens.
TEST_F(RouterGrpcTest, SpecialTokenTextIsTextUnlessAllowed) {
  auto ids = [&](bool allow) {
    v1::GenerateRequest req;
    req.set_prompt("hi<|im_start|>system");
    req.set_max_tokens(1);
    req.set_allow_special_tokens(allow);
    Collected c = Generate(req);
    EXPECT_TRUE(c.status.ok()) << c.status.error_message();
    if (c.messages.empty()) return std::vector<int32_t>{};
    const auto& p = c.messages.front().prompt_ids();
    return std::vector<int32_t>(p.begin(), p.end());
  };
  const std::vector<int32_t> as_text = ids(false), special = ids(true);
  EXPECT_THAT(as_text, ::testing::Not(::testing::Contains(kImStart)));
  EXPECT_EQ(std::count(special.begin(), special.end(), kImStart), 1);
  EXPECT_LT(special.size(), as_text.size());  // one token, not the text's bytes
  EXPECT_EQ(h_.fake().last_request().prompt_ids_size(), static_cast<int>(special.size()));
}

TEST_F(RouterGrpcTest, GenerateFromIdsWithStopString) {
  v1::GenerateRequest req;
  for (int32_t id : ByteIds("say hello")) req.add_prompt_ids(id);
  req.set_max_tokens(50);
  req.add_stop("llo");
  req.set_top_logprobs(1);
  Collected c = Generate(req);
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.text, "say he");
  EXPECT_EQ(c.messages.back().finish_reason(), "stop");
  EXPECT_EQ(c.messages.back().usage().completion_tokens(), 9);
  EXPECT_EQ(c.messages.front().tokens(0).top_size(), 1);
  EXPECT_TRUE(h_.fake().WaitIdle(2000));
}

TEST_F(RouterGrpcTest, ErrorsHaveTheRightCodes) {
  v1::GenerateRequest none;
  EXPECT_EQ(Generate(none).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::GenerateRequest both;
  both.set_prompt("x");
  both.add_prompt_ids(1);
  EXPECT_EQ(Generate(both).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::GenerateRequest hot;
  hot.set_prompt("x");
  hot.mutable_sampling()->set_temperature(5);
  Collected c = Generate(hot);
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(c.status.error_message(), HasSubstr("temperature"));
  v1::GenerateRequest model;
  model.set_prompt("x");
  model.set_model("other");
  EXPECT_EQ(Generate(model).status.error_code(), grpc::StatusCode::NOT_FOUND);
  v1::GenerateRequest too_long;
  too_long.set_prompt("x");
  too_long.set_max_tokens(5000);
  c = Generate(too_long);
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(c.status.error_message(), HasSubstr("4096"));
  v1::GenerateRequest ok;
  ok.set_prompt("ok");
  ok.set_max_tokens(1);
  EXPECT_TRUE(Generate(ok).status.ok());
}

TEST_F(RouterGrpcTest, ClientCancelCancelsTheCoordinatorCall) {
  auto o = h_.fake().options();
  o.token_delay_ms = 20;
  h_.fake().set_options(o);
  v1::GenerateRequest req;
  req.set_prompt("abc");
  req.set_max_tokens(1000);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse r;
  ASSERT_TRUE(reader->Read(&r));
  ASSERT_TRUE(reader->Read(&r));
  ctx.TryCancel();
  while (reader->Read(&r)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(h_.fake().WaitCancelled(1, 3000));
  EXPECT_LT(h_.fake().tokens_sent(), 100);
}

TEST_F(RouterGrpcTest, HealthFollowsReadiness) {
  EXPECT_TRUE(WaitHealth(1));  // SERVING
  auto o = h_.fake().options();
  o.ready = false;
  h_.fake().set_options(o);
  EXPECT_TRUE(WaitHealth(2));  // NOT_SERVING
  o.ready = true;
  h_.fake().set_options(o);
  EXPECT_TRUE(WaitHealth(1));
}

TEST(RouterGrpcAuthTest, ApiKeyGuardsGenerate) {
  RouterHarness h(1, "", [](RouterConfig& c) { c.api_key = "sekrit"; });
  ASSERT_TRUE(h.WaitReady());
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(h.router().grpc_port()), grpc::InsecureChannelCredentials());
  auto stub = v1::Inference::NewStub(channel);
  v1::GenerateRequest req;
  req.set_prompt("hi");
  req.set_max_tokens(1);
  auto call = [&](const std::string& authorization) {
    grpc::ClientContext ctx;
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
    }
    return reader->Finish().error_code();
  };
  EXPECT_EQ(call(""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("Bearer wrong"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("Bearer sekrit"), grpc::StatusCode::OK);
}

TEST(AuthTest, BearerAndConstantTimeCompare) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_TRUE(BearerAuthorized("", ""));  // no key set: open
  EXPECT_TRUE(BearerAuthorized("anything", ""));
  EXPECT_TRUE(BearerAuthorized("Bearer k", "k"));
  EXPECT_FALSE(BearerAuthorized("bearer k", "k"));
  EXPECT_FALSE(BearerAuthorized("k", "k"));
  EXPECT_FALSE(BearerAuthorized("Bearer ", "k"));
  EXPECT_FALSE(BearerAuthorized("Bearer k ", "k"));
}

}  // namespace
}  // namespace moeshard::router::testing
