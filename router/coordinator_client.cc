#include "router/coordinator_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/security/internal_grpc.h"
#include "proto/status_convert.h"

namespace moeshard::router {

CoordinatorClient::CoordinatorClient(std::string address) : address_(std::move(address)) {
  grpc::ChannelArguments args;
  // Token streams can be long: keep idle connections alive and notice dead peers.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, 64 << 20);
  args.SetInt(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, 64 << 20);
  // Reconnect quickly after a coordinator restarts (the default backoff grows to 2 min).
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  channel_ = CreateInternalChannel(address_, args);
  stub_ = v1::Coordinator::NewStub(channel_);
}

absl::StatusOr<v1::StatusReply> CoordinatorClient::GetStatus(absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  v1::StatusReply reply;
  grpc::Status st = stub_->GetStatus(&ctx, v1::StatusRequest(), &reply);
  if (!st.ok()) {
    return absl::Status(FromGrpcStatus(st).code(), absl::StrCat("coordinator ", address_, ": ", st.error_message()));
  }
  return reply;
}

GenerateCall::GenerateCall(CoordinatorClient* client, const v1::SeqRequest& request) {
  reader_ = client->stub()->Generate(&context_, request);
}

GenerateCall::~GenerateCall() {
  // A reader must be finished before it goes away; cancel first so that Finish() cannot
  // wait on a stream that still produces tokens.
  std::lock_guard<std::mutex> lock(mu_);
  if (!finished_) {
    context_.TryCancel();
    cancelled_ = true;
    v1::SeqUpdate drain;
    while (reader_->Read(&drain)) {
    }
    reader_->Finish().ok();
    finished_ = true;
  }
}

bool GenerateCall::Read(v1::SeqUpdate* update) { return reader_->Read(update); }

void GenerateCall::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_ || finished_) return;
  cancelled_ = true;
  context_.TryCancel();
}

bool GenerateCall::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

absl::Status GenerateCall::Finish() {
  grpc::Status st = reader_->Finish();
  std::lock_guard<std::mutex> lock(mu_);
  finished_ = true;
  return FromGrpcStatus(st);
}

}  // namespace moeshard::router
