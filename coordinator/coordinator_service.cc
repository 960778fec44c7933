#include "coordinator/coordinator_service.h"

#include <grpcpp/grpcpp.h>

#include <cstdio>

#include "common/security/internal_grpc.h"
#include "coordinator/wire.h"
#include "proto/status_convert.h"

namespace moeshard {

grpc::Status CoordinatorServiceImpl::Generate(grpc::ServerContext* ctx, const v1::SeqRequest* req,
                                              grpc::ServerWriter<v1::SeqUpdate>* writer) {
  if (grpc::Status auth = CheckClusterCredential(ctx); !auth.ok()) return auth;
  auto s = engine_->Submit(FromProto(*req));
  if (!s.ok()) return ToGrpcStatus(s.status());
  std::shared_ptr<SeqStream> stream = *s;
  for (;;) {
    std::deque<SeqUpdate> batch;
    bool done = false;
    {
      std::unique_lock<std::mutex> l(stream->mu);
      stream->cv.wait_for(l, std::chrono::milliseconds(20), [&] { return !stream->updates.empty() || stream->done; });
      batch.swap(stream->updates);
      done = stream->done;
    }
    // A finished sequence is not an abort, whatever the client does after the last update.
    if (ctx->IsCancelled() && !(done && batch.empty())) {
      std::fprintf(stderr, "moeshard-coordinator: [%s] client cancelled, aborting seq %ld\n", stream->request_id.c_str(),
                   static_cast<long>(stream->seq_id));
      engine_->Cancel(stream->seq_id);
      return grpc::Status::CANCELLED;
    }
    for (const SeqUpdate& u : batch) {
      v1::SeqUpdate m;
      ToProto(u, &m);
      if (!writer->Write(m)) {
        engine_->Cancel(stream->seq_id);
        return grpc::Status::CANCELLED;
      }
    }
    if (done && batch.empty()) {
      std::lock_guard<std::mutex> l(stream->mu);
      if (stream->updates.empty()) break;
    }
  }
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::GetStatus(grpc::ServerContext* ctx, const v1::StatusRequest*, v1::StatusReply* rep) {
  if (grpc::Status auth = CheckClusterCredential(ctx); !auth.ok()) return auth;
  ToProto(engine_->GetStatus(), rep);
  return grpc::Status::OK;
}

grpc::Status CoordinatorServiceImpl::StoreSet(grpc::ServerContext* ctx, const v1::StoreSetRequest* req, v1::StoreSetReply*) {
  if (grpc::Status auth = CheckClusterCredential(ctx); !auth.ok()) return auth;
  return ToGrpcStatus(store_->Set(req->key(), req->value()));
}

grpc::Status CoordinatorServiceImpl::StoreGet(grpc::ServerContext* ctx, const v1::StoreGetRequest* req, v1::StoreGetReply* rep) {
  if (grpc::Status auth = CheckClusterCredential(ctx); !auth.ok()) return auth;
  auto timeout = std::chrono::milliseconds(std::clamp<int64_t>(req->timeout_ms(), 0, 600000));
  auto v = store_->Get(req->key(), timeout);
  if (!v.ok()) return ToGrpcStatus(v.status());
  rep->set_value(*v);
  return grpc::Status::OK;
}

}  // namespace moeshard
