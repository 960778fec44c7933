#include "worker/service/grpc_kv_store.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/security/internal_grpc.h"

namespace moeshard {

GrpcKvStore::GrpcKvStore(const std::string& address)
    : stub_(v1::Coordinator::NewStub(CreateInternalChannel(address, grpc::ChannelArguments()))) {}

absl::Status GrpcKvStore::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::StoreSetRequest req;
  req.set_key(key);
  req.set_value(value);
  v1::StoreSetReply rep;
  grpc::Status st = stub_->StoreSet(&ctx, req, &rep);
  if (!st.ok()) return absl::UnavailableError(absl::StrCat("store set '", key, "': ", st.error_message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> GrpcKvStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout + std::chrono::seconds(5));
  v1::StoreGetRequest req;
  req.set_key(key);
  req.set_timeout_ms(timeout.count());
  v1::StoreGetReply rep;
  grpc::Status st = stub_->StoreGet(&ctx, req, &rep);
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return absl::DeadlineExceededError(absl::StrCat("store get '", key, "' timed out"));
  }
  if (!st.ok()) return absl::UnavailableError(absl::StrCat("store get '", key, "': ", st.error_message()));
  return rep.value();
}

}  // namespace moeshard
