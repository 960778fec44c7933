// The gRPC API (--grpc): moeshard.v1.Inference/Generate streams the same greedy tokens as
// HTTP, with logprobs and usage; bad requests are INVALID_ARGUMENT; with --api-key a call
// without the key is UNAUTHENTICATED; grpc.health.v1.Health/Check says SERVING (called
// through a generic stub: its messages are one varint, encoded here by hand).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <future>

#include "absl/strings/str_cat.h"
#include "tests/itest/suite.h"
#include "common/status.h"
#include "proto/moeshard.grpc.pb.h"

namespace moeshard::itest {
namespace {

struct GrpcResult {
  std::vector<int32_t> token_ids, prompt_ids;
  std::vector<v1::TokenOutput> tokens;
  std::string finish_reason;
  v1::Usage usage;
  int num_messages = 0;
};

void SetUp(const Context& ctx, grpc::ClientContext* cc, bool with_key = true) {
  cc->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  if (with_key && !ctx.opts.api_key.empty())
    cc->AddMetadata("authorization", absl::StrCat("Bearer ", ctx.opts.api_key));
}

std::string Describe(const grpc::Status& s) {
  return absl::StrCat("gRPC status ", s.error_code(), ": ", s.error_message());
}

absl::StatusOr<GrpcResult> Generate(const Context& ctx, v1::Inference::Stub& stub, const v1::GenerateRequest& req,
                                    grpc::Status* status_out = nullptr, bool with_key = true) {
  grpc::ClientContext cc;
  SetUp(ctx, &cc, with_key);
  auto reader = stub.Generate(&cc, req);
  GrpcResult g;
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (g.num_messages++ == 0) g.prompt_ids.assign(resp.prompt_ids().begin(), resp.prompt_ids().end());
    for (const auto& t : resp.tokens()) {
      g.token_ids.push_back(t.token_id());
      g.tokens.push_back(t);
    }
    if (!resp.finish_reason().empty()) {
      if (!g.finish_reason.empty()) return absl::InternalError("finish_reason set on two messages");
      g.finish_reason = resp.finish_reason();
      if (!resp.has_usage()) return absl::InternalError("the last message has no usage");
      g.usage = resp.usage();
    }
  }
  grpc::Status st = reader->Finish();
  if (status_out != nullptr) *status_out = st;
  if (!st.ok()) return absl::UnavailableError(Describe(st));
  if (g.finish_reason.empty()) return absl::InternalError("no message set finish_reason");
  return g;
}

v1::GenerateRequest Request(const Context& ctx, const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest req;
  req.set_model(ctx.model_name);
  for (int32_t id : prompt) req.add_prompt_ids(id);
  req.set_max_tokens(max_tokens);
  req.mutable_sampling()->set_temperature(0);
  req.set_ignore_eos(true);
  return req;
}

absl::Status SameAsHttp(Context& ctx, v1::Inference::Stub& stub) {
  GenRequest h;
  h.prompt_ids = MakePrompt(20, 300, ctx.prompt_vocab);
  h.max_tokens = 12;
  ASSIGN_OR_RETURN(GenResult http, ctx.api->Complete(h));
  ASSIGN_OR_RETURN(GrpcResult g, Generate(ctx, stub, Request(ctx, h.prompt_ids, 12)));
  // The second request finds the first's prompt in the prefix cache and prefills only the rest:
  // in bf16 that can flip a near tie (token_match.h), in float32 nothing may differ.
  RETURN_IF_ERROR(SameGreedy(ctx, h.prompt_ids, http.token_ids, g.token_ids, "gRPC vs HTTP"));
  if (g.finish_reason != "length")
    return absl::InternalError(absl::StrCat("finish_reason '", g.finish_reason, "', want length"));
  if (g.usage.prompt_tokens() != 20 || g.usage.completion_tokens() != 12) {
    return absl::InternalError(
        absl::StrCat("usage ", g.usage.ShortDebugString(), ", want 20 prompt and 12 completion tokens"));
  }
  if (g.prompt_ids != h.prompt_ids) return absl::InternalError("the first message does not echo prompt_ids");
  if (g.num_messages < 2)
    return absl::InternalError(absl::StrCat("12 tokens arrived in ", g.num_messages, " message(s): not streamed"));
  return absl::OkStatus();
}

absl::Status Logprobs(Context& ctx, v1::Inference::Stub& stub) {
  v1::GenerateRequest req = Request(ctx, MakePrompt(9, 301, ctx.prompt_vocab), 5);
  req.set_logprobs(true);
  req.set_top_logprobs(3);
  ASSIGN_OR_RETURN(GrpcResult g, Generate(ctx, stub, req));
  for (size_t i = 0; i < g.tokens.size(); ++i) {
    const v1::TokenOutput& t = g.tokens[i];
    if (t.top_size() != 3)
      return absl::InternalError(absl::StrCat("token ", i, ": ", t.top_size(), " alternatives, want 3"));
    for (int k = 1; k < 3; ++k) {
      if (t.top(k).logprob() > t.top(k - 1).logprob() + 1e-6)
        return absl::InternalError(absl::StrCat("token ", i, ": not sorted"));
    }
    if (t.top(0).token_id() != t.token_id() && std::abs(t.top(0).logprob() - t.logprob()) > 1e-4) {
      return absl::InternalError(absl::StrCat("token ", i, ": greedy token ", t.token_id(), " is not the most likely (",
                                              t.ShortDebugString(), ")"));
    }
    if (t.logprob() > 1e-6) return absl::InternalError(absl::StrCat("token ", i, ": logprob > 0"));
  }
  return absl::OkStatus();
}

absl::Status BadRequest(Context& ctx, v1::Inference::Stub& stub) {
  for (int variant = 0; variant < 3; ++variant) {
    v1::GenerateRequest req = Request(ctx, {1, 2, 3}, 4);
    if (variant == 0) req.clear_prompt_ids();
    if (variant == 1) req.set_max_tokens(-1);
    if (variant == 2) req.mutable_sampling()->set_temperature(-1);
    grpc::Status st;
    auto r = Generate(ctx, stub, req, &st);
    if (r.ok() || st.error_code() != grpc::StatusCode::INVALID_ARGUMENT) {
      const char* what[] = {"an empty prompt", "max_tokens -1", "temperature -1"};
      return absl::InternalError(
          absl::StrCat(what[variant], ": want INVALID_ARGUMENT, got ", r.ok() ? "OK" : Describe(st)));
    }
  }
  return absl::OkStatus();
}

absl::Status GrpcNeedsKey(Context& ctx, v1::Inference::Stub& stub) {
  if (ctx.opts.api_key.empty()) return Skip("needs --api-key");
  grpc::Status st;
  auto r = Generate(ctx, stub, Request(ctx, {1, 2, 3}, 2), &st, /*with_key=*/false);
  if (r.ok() || st.error_code() != grpc::StatusCode::UNAUTHENTICATED) {
    return absl::InternalError(
        absl::StrCat("a call without the key: want UNAUTHENTICATED, got ", r.ok() ? "OK" : Describe(st)));
  }
  return absl::OkStatus();
}

absl::Status Health(Context& ctx, const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext cc;
  SetUp(ctx, &cc);
  grpc::ByteBuffer request, response;  // HealthCheckRequest{service: ""} encodes to no bytes
  grpc::Slice empty;
  request = grpc::ByteBuffer(&empty, 1);
  std::promise<grpc::Status> done;
  stub.UnaryCall(&cc, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) { done.set_value(s); });
  grpc::Status st = done.get_future().get();
  if (!st.ok()) return absl::UnavailableError(absl::StrCat("Health/Check: ", Describe(st)));
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("Health/Check: unreadable response");
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{status = 1}: field 1, varint -> 0x08 <status>; SERVING is 1.
  const int status = bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : 0;
  if (status != 1) return absl::InternalError(absl::StrCat("Health/Check status ", status, ", want SERVING (1)"));
  return absl::OkStatus();
}

}  // namespace

void RunGrpcChecks(Context& ctx, Suite& suite) {
  const char* kNames[] = {"grpc: Generate streams the same tokens as HTTP", "grpc: logprobs and top_logprobs sorted",
                          "grpc: bad requests are INVALID_ARGUMENT",
                          "grpc: a call without the API key is UNAUTHENTICATED",
                          "grpc: grpc.health.v1 Check is SERVING"};
  if (ctx.opts.grpc.empty()) {
    for (const char* n : kNames) suite.Run(n, [] { return Skip("no --grpc"); });
    return;
  }
  auto channel = grpc::CreateChannel(ctx.opts.grpc, grpc::InsecureChannelCredentials());
  auto stub = v1::Inference::NewStub(channel);
  suite.Run(kNames[0], [&] { return SameAsHttp(ctx, *stub); });
  suite.Run(kNames[1], [&] { return Logprobs(ctx, *stub); });
  suite.Run(kNames[2], [&] { return BadRequest(ctx, *stub); });
  suite.Run(kNames[3], [&] { return GrpcNeedsKey(ctx, *stub); });
  suite.Run(kNames[4], [&] { return Health(ctx, channel); });
}

}  // namespace moeshard::itest
