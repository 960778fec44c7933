// Setup: the router answers and is ready, lists its model, and the reference model
// (--model) loads. Fills the context the other checks read (model name, vocabulary,
// context length, whether text prompts work).
#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/itest/suite.h"
#include "common/status.h"

namespace moeshard::itest {
namespace {

absl::Status WaitReady(Context& ctx) {
  auto t0 = std::chrono::steady_clock::now();
  HttpResponse r;
  for (;;) {
    r = ctx.http.Get("/ready");
    if (r.status == 200) return absl::OkStatus();
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > ctx.opts.ready_timeout_s) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return absl::UnavailableError(
      absl::StrCat("GET /ready not 200 after ", ctx.opts.ready_timeout_s, " s: ", r.Describe()));
}

absl::Status Models(Context& ctx) {
  HttpResponse r = ctx.http.Get("/v1/models");
  if (r.status != 200) return absl::UnavailableError(absl::StrCat("GET /v1/models: ", r.Describe()));
  ASSIGN_OR_RETURN(Json j, r.JsonBody());
  if (j.value("object", "") != "list" || !j.contains("data") || !j["data"].is_array() || j["data"].empty()) {
    return absl::InvalidArgumentError(absl::StrCat("not a non-empty {object: list, data: [...]}: ", r.Describe()));
  }
  for (const Json& m : j["data"]) {
    if (!m.is_object() || !m.contains("id") || !m["id"].is_string() || m.value("object", "") != "model") {
      return absl::InvalidArgumentError(absl::StrCat("a model entry without id / object 'model': ", m.dump()));
    }
    if (!m.contains("created") || !m.contains("owned_by")) {
      return absl::InvalidArgumentError(absl::StrCat("a model entry without created / owned_by: ", m.dump()));
    }
  }
  const Json& m = j["data"][0];
  ctx.model_name = m["id"];
  if (m.contains("max_model_len") && m["max_model_len"].is_number_integer()) ctx.max_model_len = m["max_model_len"];
  return absl::OkStatus();
}

absl::Status LoadReference(Context& ctx) {
  if (ctx.opts.model_path.empty()) return Skip("no --model");
  ASSIGN_OR_RETURN(ctx.reference, ReferenceEngine::Load(ctx.opts.model_path));
  ctx.vocab = ctx.reference->config().vocab_size;
  ctx.prompt_vocab = ctx.vocab;
  ctx.has_tokenizer = ctx.reference->tokenizer() != nullptr;
  // The embedding table may be padded past the tokenizer's ids, which a server may refuse.
  if (ctx.has_tokenizer) ctx.prompt_vocab = std::min<int64_t>(ctx.vocab, ctx.reference->tokenizer()->vocab_size());
  if (ctx.max_model_len == 0) ctx.max_model_len = ctx.reference->config().max_position_embeddings;
  return absl::OkStatus();
}

// Without --model: a text prompt tells whether the served model has a tokenizer.
void ProbeTokenizer(Context& ctx) {
  if (ctx.reference != nullptr) return;
  GenRequest r;
  r.prompt_text = "Hello";
  r.max_tokens = 1;
  ctx.has_tokenizer = ctx.api->Complete(r).ok();
}

}  // namespace

void RunSetupChecks(Context& ctx, Suite& suite) {
  suite.Run("health: GET /health is 200 without a key", [&]() -> absl::Status {
    HttpResponse r = ctx.http.Get("/health", Auth::kNone);
    if (r.status != 200) return absl::UnavailableError(r.Describe());
    return absl::OkStatus();
  });
  suite.Run("ready: GET /ready turns 200", [&] { return WaitReady(ctx); });
  suite.Run("models: GET /v1/models lists the served model", [&] { return Models(ctx); });
  suite.Run("reference: --model loads in-process", [&] { return LoadReference(ctx); });
  if (ctx.model_name.empty()) ctx.model_name = "unknown";
  ctx.api = std::make_unique<OpenAiApi>(&ctx.http, ctx.model_name, &ctx.tally);
  ProbeTokenizer(ctx);
  if (!ctx.opts.metrics.empty()) {
    suite.Run("metrics: every /metrics URL answers and parses", [&]() -> absl::Status {
      ASSIGN_OR_RETURN(MetricsView v, MetricsView::Fetch(ctx.opts.metrics, ctx.opts.api_key));
      if (v.num_coordinators() == 0) {
        return absl::NotFoundError("no URL exports moeshard_kv_cache_usage_perc or moeshard:kv_cache_usage_perc (no coordinator among --metrics)");
      }
      ctx.metrics_at_start = std::move(v);
      return absl::OkStatus();
    });
  }
}

}  // namespace moeshard::itest
