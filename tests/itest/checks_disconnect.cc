// Client disconnects: a long stream (max_tokens 2000, ignore_eos) is abandoned after a
// few chunks. Within a few seconds the coordinators must count the abort
// (request_success_total{finished_reason="abort"}), have no request running, be back at
// their idle KV usage, and have stopped generating for it; the cluster keeps serving.
// The same for a gRPC Generate call that the client cancels.
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/itest/suite.h"
#include "common/status.h"
#include "proto/moeshard.grpc.pb.h"

namespace moeshard::itest {
namespace {

constexpr int kLongTokens = 2000, kChunksBeforeLeaving = 4;
// Tokens a sequence may still produce after the client left: the steps already in
// flight plus the one in which the router notices (a write that fails).
constexpr int kSlackTokens = 32;

struct Idle {
  double kv = 0, aborts = 0, generated = 0;
};

absl::StatusOr<Idle> WaitIdle(const Context& ctx, double timeout_s) {
  auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    ASSIGN_OR_RETURN(MetricsView v, MetricsView::Fetch(ctx.opts.metrics, ctx.opts.api_key));
    if (v.Coord("num_requests_running") == 0 && v.Coord("num_requests_waiting") == 0) {
      return Idle{v.CoordMax("kv_cache_usage_perc"),
                  v.Coord("request_success_total", {{"finished_reason", "abort"}}),
                  v.Coord("generation_tokens_total")};
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      return absl::DeadlineExceededError(absl::StrCat("the cluster is not idle after ", timeout_s, " s (running ",
                                                      v.Coord("num_requests_running"), ", waiting ",
                                                      v.Coord("num_requests_waiting"), ")"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// After the client left having received `received` tokens: abort counted, nothing
// running, KV usage back to `idle.kv`, generation stopped.
absl::Status ExpectCleanedUp(const Context& ctx, const Idle& idle, int64_t received, double timeout_s) {
  auto t0 = std::chrono::steady_clock::now();
  std::string last;
  for (;;) {
    ASSIGN_OR_RETURN(MetricsView v, MetricsView::Fetch(ctx.opts.metrics, ctx.opts.api_key));
    const double aborts = v.Coord("request_success_total", {{"finished_reason", "abort"}});
    const double running = v.Coord("num_requests_running") + v.Coord("num_requests_waiting");
    const double kv = v.CoordMax("kv_cache_usage_perc");
    const double generated = v.Coord("generation_tokens_total") - idle.generated;
    last = absl::StrCat("abort count +", aborts - idle.aborts, ", running+waiting ", running, ", kv_cache_usage_perc ",
                        kv, " (idle ", idle.kv, "), generation_tokens_total +", generated, " for ", received,
                        " tokens received");
    if (aborts >= idle.aborts + 1 && running == 0 && kv <= idle.kv + 1e-9) {
      if (generated > received + kSlackTokens) {
        return absl::InternalError(absl::StrCat("the sequence kept generating after the client left: ", last));
      }
      if (aborts > idle.aborts + 1) return absl::InternalError(absl::StrCat("more than one abort counted: ", last));
      return absl::OkStatus();
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      return absl::DeadlineExceededError(
          absl::StrCat("not cleaned up ", timeout_s, " s after the client left: ", last));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

absl::Status HttpDisconnect(Context& ctx) {
  if (ctx.opts.metrics.empty()) return Skip("needs --metrics (coordinator counters)");
  ASSIGN_OR_RETURN(Idle idle, WaitIdle(ctx, 30));
  GenRequest r;
  r.prompt_ids = MakePrompt(24, 400, ctx.prompt_vocab);
  r.max_tokens = kLongTokens;
  ASSIGN_OR_RETURN(GenResult g,
                   ctx.api->CompleteStream(r, [](int64_t chunks) { return chunks < kChunksBeforeLeaving; }));
  if (!g.finish_reason.empty()) return absl::InternalError("the long stream finished before the client left");
  ctx.tally.abandoned += 1;
  return ExpectCleanedUp(ctx, idle, g.token_ids.size(), 10);
}

absl::Status GrpcCancel(Context& ctx) {
  if (ctx.opts.grpc.empty()) return Skip("no --grpc");
  if (ctx.opts.metrics.empty()) return Skip("needs --metrics (coordinator counters)");
  ASSIGN_OR_RETURN(Idle idle, WaitIdle(ctx, 30));
  auto stub = v1::Inference::NewStub(grpc::CreateChannel(ctx.opts.grpc, grpc::InsecureChannelCredentials()));
  v1::GenerateRequest req;
  req.set_model(ctx.model_name);
  for (int32_t id : MakePrompt(24, 401, ctx.prompt_vocab)) req.add_prompt_ids(id);
  req.set_max_tokens(kLongTokens);
  req.set_ignore_eos(true);
  grpc::ClientContext cc;
  if (!ctx.opts.api_key.empty()) cc.AddMetadata("authorization", absl::StrCat("Bearer ", ctx.opts.api_key));
  auto reader = stub->Generate(&cc, req);
  v1::GenerateResponse resp;
  int64_t received = 0;
  for (int i = 0; i < kChunksBeforeLeaving; ++i) {
    if (!reader->Read(&resp)) {
      grpc::Status st = reader->Finish();
      return absl::InternalError(absl::StrCat("the long call ended after ", i, " messages: status ", st.error_code(),
                                              ": ", st.error_message()));
    }
    received += resp.tokens_size();
    if (!resp.finish_reason().empty()) return absl::InternalError("the long call finished before the client cancelled");
  }
  cc.TryCancel();
  ctx.tally.abandoned += 1;
  while (reader->Read(&resp)) received += resp.tokens_size();
  grpc::Status st = reader->Finish();
  if (st.error_code() != grpc::StatusCode::CANCELLED) {
    return absl::InternalError(absl::StrCat("want CANCELLED, got status ", st.error_code(), ": ", st.error_message()));
  }
  return ExpectCleanedUp(ctx, idle, received, 10);
}

}  // namespace

void RunDisconnectChecks(Context& ctx, Suite& suite) {
  suite.Run("disconnect: an abandoned stream is aborted, its KV freed, no more tokens",
            [&] { return HttpDisconnect(ctx); });
  suite.Run("disconnect: a cancelled gRPC call is aborted and its KV freed", [&] { return GrpcCancel(ctx); });
  suite.Run("disconnect: the cluster still serves", [&] { return StillServes(ctx, true, 402, 4); });
}

}  // namespace moeshard::itest
