#include "fake_coordinator.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace moeshard::router::testing {

FakeCoordinator::~FakeCoordinator() { Stop(); }

std::string FakeCoordinator::Start() {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  return "127.0.0.1:" + std::to_string(port);
}

void FakeCoordinator::Stop() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server_->Wait();
  server_.reset();
}

void FakeCoordinator::set_options(const Options& o) {
  std::lock_guard<std::mutex> lock(mu_);
  options_ = o;
}

FakeCoordinator::Options FakeCoordinator::options() {
  std::lock_guard<std::mutex> lock(mu_);
  return options_;
}

v1::SeqRequest FakeCoordinator::last_request() {
  std::lock_guard<std::mutex> lock(mu_);
  return last_request_;
}

grpc::Status FakeCoordinator::GetStatus(grpc::ServerContext*, const v1::StatusRequest*, v1::StatusReply* reply) {
  const Options o = options();
  reply->set_ready(o.ready);
  reply->set_outstanding_tokens(o.outstanding_tokens);
  reply->set_num_running(num_running_);
  reply->set_max_model_len(o.max_model_len);
  reply->set_model("fake");
  reply->set_vocab_size(305);
  reply->set_queue_full(o.queue_full);
  if (!o.ready) reply->set_error("fake coordinator told to be not ready");
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::Generate(grpc::ServerContext* context, const v1::SeqRequest* request,
                                       grpc::ServerWriter<v1::SeqUpdate>* writer) {
  const Options o = options();
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_request_ = *request;
  }
  ++num_calls_;
  if (o.fail_generate) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake coordinator told to fail");
  if (o.queue_full) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "fake coordinator's queue is full");
  if (request->prompt_ids().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty prompt");
  std::vector<int32_t> script;
  for (int32_t id : request->prompt_ids()) {
    if (id < o.first_special_id) script.push_back(id);
  }
  if (script.empty()) script.push_back('x');
  ++num_running_;
  auto cancelled = [&] {
    ++num_cancelled_;
    --num_running_;
    Notify();
    return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  };
  const auto& stops = request->stop_token_ids();
  for (int32_t i = 0; i < request->max_tokens(); ++i) {
    if (context->IsCancelled()) return cancelled();
    const bool eos = o.eos_after == i && !request->ignore_eos();
    const int32_t tok = eos ? o.eos_id : script[i % script.size()];
    v1::SeqUpdate u;
    v1::TokenOutput* t = u.add_tokens();
    t->set_token_id(tok);
    t->set_logprob(-0.25f * static_cast<float>(i % 4 + 1));
    for (int k = 0; k < request->top_logprobs(); ++k) {
      v1::TopLogprob* top = t->add_top();
      top->set_token_id(k == 0 ? tok : ('a' + k));
      top->set_logprob(k == 0 ? t->logprob() : -3.0f - k);
    }
    if (i == 0) {
      u.set_prompt_tokens(request->prompt_ids_size());
      u.set_cached_tokens(o.cached_tokens);
    }
    if (i == o.abort_after) {
      v1::SeqUpdate abort;
      abort.set_finish_reason("abort");
      writer->Write(abort);
      break;
    }
    if (eos || std::find(stops.begin(), stops.end(), tok) != stops.end()) {
      u.set_finish_reason("stop");
    } else if (i + 1 == request->max_tokens()) {
      u.set_finish_reason("length");
    }
    if (!writer->Write(u)) return cancelled();
    ++tokens_sent_;
    if (!u.finish_reason().empty()) break;
    if (o.token_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.token_delay_ms));
  }
  --num_running_;
  Notify();
  return grpc::Status::OK;
}

grpc::Status FakeCoordinator::StoreSet(grpc::ServerContext*, const v1::StoreSetRequest*, v1::StoreSetReply*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "fake");
}

grpc::Status FakeCoordinator::StoreGet(grpc::ServerContext*, const v1::StoreGetRequest*, v1::StoreGetReply*) {
  return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "fake");
}

void FakeCoordinator::Notify() {
  { std::lock_guard<std::mutex> lock(mu_); }  // a waiter is either before its check or asleep
  cv_.notify_all();
}

bool FakeCoordinator::WaitCancelled(int n, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return num_cancelled_ >= n; });
}

bool FakeCoordinator::WaitIdle(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return num_running_ == 0; });
}

}  // namespace moeshard::router::testing
