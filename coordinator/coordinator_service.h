// The Coordinator gRPC service: Generate (token ids in, a stream of token updates out;
// cancelling the call aborts the sequence), GetStatus (readiness and load, polled by the
// router), and the key-value store the workers bootstrap their communicators through.
#pragma once

#include <memory>

#include "common/comm/kv_store.h"
#include "coordinator/engine.h"
#include "proto/moeshard.grpc.pb.h"

namespace moeshard {

class CoordinatorServiceImpl final : public v1::Coordinator::Service {
 public:
  CoordinatorServiceImpl(Engine* engine, KvStore* store) : engine_(engine), store_(store) {}

  grpc::Status Generate(grpc::ServerContext* ctx, const v1::SeqRequest* req,
                        grpc::ServerWriter<v1::SeqUpdate>* writer) override;
  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::StatusRequest* req, v1::StatusReply* rep) override;
  grpc::Status StoreSet(grpc::ServerContext* ctx, const v1::StoreSetRequest* req, v1::StoreSetReply* rep) override;
  grpc::Status StoreGet(grpc::ServerContext* ctx, const v1::StoreGetRequest* req, v1::StoreGetReply* rep) override;

 private:
  Engine* engine_;
  KvStore* store_;
};

}  // namespace moeshard
