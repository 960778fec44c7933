#include "router/grpc_service.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/security/internal_grpc.h"
#include "common/status.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "proto/proto_convert.h"
#include "proto/status_convert.h"
#include "router/api_error.h"
#include "router/auth.h"
#include "router/http_server.h"
#include "router/log.h"
#include "router/prompt.h"

namespace moeshard::router {
namespace {

void AddTokens(const GenerationDelta& d, v1::GenerateResponse* r) {
  for (const TokenInfo& t : d.tokens) {
    v1::TokenOutput* out = r->add_tokens();
    out->set_token_id(t.id);
    out->set_logprob(t.logprob);
    for (const auto& [id, lp] : t.top) {
      v1::TopLogprob* top = out->add_top();
      top->set_token_id(id);
      top->set_logprob(lp);
    }
  }
  r->set_text(d.text);
}

}  // namespace

absl::StatusOr<CompletionRequest> FromProto(const v1::GenerateRequest& request) {
  CompletionRequest r;
  if (request.prompt().empty() == request.prompt_ids().empty()) {
    return InvalidParam("prompt", "set exactly one of prompt (text) and prompt_ids");
  }
  r.prompt_is_ids = !request.prompt_ids().empty();
  r.prompt_text = request.prompt();
  r.allow_special_tokens = request.allow_special_tokens();
  r.prompt_ids.assign(request.prompt_ids().begin(), request.prompt_ids().end());
  for (int32_t id : r.prompt_ids) {
    if (id < 0) return InvalidParam("prompt_ids", absl::StrCat("token ids must be >= 0, got ", id));
  }
  GenerationParams& p = r.params;
  p.model = request.model();
  if (request.max_tokens() != 0) p.max_tokens = request.max_tokens();
  p.sampling = SamplingFromProto(request.sampling());
  if (request.sampling().top_p() != 0) p.sampling.top_p = request.sampling().top_p();  // validated below
  if (p.sampling.top_k == -1) p.sampling.top_k = 0;  // -1: vLLM's "off"
  p.stop.assign(request.stop().begin(), request.stop().end());
  p.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  p.ignore_eos = request.ignore_eos();
  p.top_logprobs = request.top_logprobs();
  p.logprobs = request.logprobs() || request.top_logprobs() > 0;
  p.stream = true;
  RETURN_IF_ERROR(ValidateGenerationParams(p));
  return r;
}

grpc::Status InferenceService::Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                                        grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const RouterServices& s = services_;
  auto auth = context->client_metadata().find("authorization");
  const std::string_view authorization = auth == context->client_metadata().end()
                                             ? std::string_view()
                                             : std::string_view(auth->second.data(), auth->second.size());
  if (!BearerAuthorized(authorization, api_key_)) {
    s.metrics->RequestRejected(kNoPool, "unauthorized");
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing or wrong API key: send the metadata 'authorization: Bearer <key>'");
  }
  std::string client_id = request->request_id();
  if (client_id.empty()) {
    auto it = context->client_metadata().find("x-request-id");
    if (it != context->client_metadata().end()) client_id = std::string(it->second.data(), it->second.size());
  }
  const std::string request_id = RequestIdFor(client_id);
  context->AddInitialMetadata("x-request-id", request_id);
  auto reject = [&](const absl::Status& st) {
    s.metrics->RequestRejected(kNoPool, absl::IsNotFound(st) ? "model_not_found" : "bad_request");
    LogLine(request_id, absl::StrCat("grpc: bad request: ", st.message()));
    return ToGrpcStatus(st);
  };
  auto parsed = FromProto(*request);
  if (!parsed.ok()) return reject(parsed.status());
  if (absl::Status st = CheckModelName(parsed->params.model, s.served_model_name); !st.ok()) return reject(st);
  auto prompt_ids = CompletionPromptIds(s.tokenizer, *parsed, s.max_prompt_bytes);
  if (!prompt_ids.ok()) return reject(prompt_ids.status());
  const std::vector<int32_t> prompt_copy = *prompt_ids;
  auto gen = Generation::Start(s, PreparedRequest{request_id, *std::move(prompt_ids), parsed->params});
  if (!gen.ok()) return ToGrpcStatus(gen.status());
  LogLine(request_id, "grpc: Generate");

  bool first = true;
  auto fill_first = [&](v1::GenerateResponse* r) {
    if (!first) return;
    r->mutable_prompt_ids()->Assign(prompt_copy.begin(), prompt_copy.end());
    r->set_request_id(request_id);
    first = false;
  };
  auto result = (*gen)->Run([&](const GenerationDelta& d) {
    if (context->IsCancelled()) return false;
    v1::GenerateResponse r;
    fill_first(&r);
    AddTokens(d, &r);
    return writer->Write(r);
  });
  if (!result.ok()) return ToGrpcStatus(result.status());
  v1::GenerateResponse last;
  fill_first(&last);
  last.set_finish_reason(result->finish_reason);
  last.mutable_usage()->set_prompt_tokens(static_cast<int32_t>(result->prompt_tokens));
  last.mutable_usage()->set_completion_tokens(static_cast<int32_t>(result->completion_tokens));
  last.mutable_usage()->set_cached_tokens(static_cast<int32_t>(result->cached_tokens));
  if (!writer->Write(last)) return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
  return grpc::Status::OK;
}

GrpcServer::~GrpcServer() { Stop(absl::ZeroDuration()); }

absl::StatusOr<int> GrpcServer::Start(const std::string& host, int port, const std::string& tls_cert_file,
                                      const std::string& tls_key_file) {
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!tls_cert_file.empty()) {
    auto tls = TlsServerCredentials(tls_cert_file, tls_key_file);
    if (!tls.ok()) return tls.status();
    creds = *tls;
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(absl::StrCat(host, ":", port), creds, &bound);
  builder.RegisterService(&service_);
  builder.SetMaxReceiveMessageSize(64 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound == 0)
    return absl::UnavailableError(absl::StrCat("grpc: cannot listen on ", host, ":", port));
  {
    std::lock_guard<std::mutex> lock(mu_);
    server_ = std::move(server);
  }
  SetServing(false);
  return bound;
}

void GrpcServer::SetServing(bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  if (server_ == nullptr || server_->GetHealthCheckService() == nullptr) return;
  server_->GetHealthCheckService()->SetServingStatus(serving);
}

void GrpcServer::Stop(absl::Duration grace) {
  std::lock_guard<std::mutex> lock(mu_);
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
  server_->Wait();
  server_.reset();
}

}  // namespace moeshard::router
