// The worker's gRPC service: a versioned handshake (protocol, model identity, the plan's
// slice for this worker) that loads only this worker's weights and joins the
// communicator group, then Step calls run in step_id order: embed or receive hidden
// states, run this shard's layers, send them on or (last stage) sample.
// Thread-safety: gRPC calls arrive on several threads; steps are serialized by step_id.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/comm/communicator.h"
#include "common/comm/kv_store.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "proto/moeshard.grpc.pb.h"
#include "common/model/model_loader.h"
#include "proto/proto_convert.h"
#include "worker/model_runner.h"
#include "worker/follow_tokens.h"
#include "worker/sampler.h"
#include "common/security/internal_grpc.h"
#include "worker/service/kv_ownership.h"
#include "worker/service/request_limits.h"

namespace moeshard {

struct WorkerOptions {
  std::string model_path;
  std::string host = "127.0.0.1";  // address peers use to reach this worker's communicator
  // Backend of this worker's runner (device, GPU index, precision, KV dtype); the KV pool
  // size and block size come from the coordinator's handshake.
  RunnerOptions runner;
  // Tensor-parallel all-reduces of GPU workers: "auto" uses NCCL when every rank of the
  // group has a GPU of its own (told apart by PCI bus id and host) and the host-staged
  // path otherwise; "nccl" requires NCCL; "host" always stages through host memory.
  std::string tp_comm = "auto";
};

class WorkerServiceImpl final : public v1::Worker::Service {
 public:
  WorkerServiceImpl(WorkerOptions options, std::shared_ptr<prometheus::Registry> registry);
  ~WorkerServiceImpl() override;

  grpc::Status Handshake(grpc::ServerContext* ctx, const v1::HandshakeRequest* req, v1::HandshakeReply* rep) override;
  grpc::Status Step(grpc::ServerContext* ctx, const v1::StepRequest* req, v1::StepReply* rep) override;
  // Takes no lock: a worker busy in a step still answers.
  grpc::Status Ping(grpc::ServerContext* ctx, const v1::PingRequest*, v1::PingReply* rep) override {
    if (grpc::Status auth = CheckClusterCredential(ctx); !auth.ok()) return auth;
    rep->set_protocol_version(kProtocolVersion);
    return grpc::Status::OK;
  }

 private:
  absl::Status DoHandshake(const v1::HandshakeRequest& req, v1::HandshakeReply* rep);
  absl::StatusOr<bool> EveryRankHasItsGpu(KvStore& store, const v1::HandshakeRequest& req,
                                          std::chrono::milliseconds timeout);
  absl::Status DoStep(const v1::StepRequest& req, v1::StepReply* rep);
  // Puts into each `follow` chunk of *req the token this worker drew for its sequence in the
  // step before (copying the request into *whole first); FailedPrecondition when it cannot.
  absl::Status ResolveFollows(const v1::StepRequest** req, v1::StepRequest* whole) const;

  WorkerOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  const WorkerLimits limits_;
  std::mutex mu_;  // guards the state below and serializes handshakes
  std::condition_variable cv_;
  int64_t next_step_ = 0;
  bool ready_ = false;
  std::string broken_;  // non-empty once a step failed half-way: the group must restart
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<Communicator> tp_comm_;  // NCCL for the runner's all-reduces, when chosen
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<ModelRunner> runner_;
  bool gpu_runner_ = false;  // runner_ is the CUDA backend (set with it)
  v1::ShardProto shard_;
  int32_t block_size_ = 0;
  KvOwnership kv_owners_;  // which KV blocks each live sequence wrote
  KvOwnership sliding_owners_{KvOwnership::Table::kSliding};  // the same in the sliding pool
  SamplerSet samplers_;
  FollowTokens follow_;  // the token each sequence drew last (lookahead steps)
  prometheus::Family<prometheus::Histogram>* step_seconds_ = nullptr;
  prometheus::Counter* steps_ok_ = nullptr;
  prometheus::Counter* steps_failed_ = nullptr;
  prometheus::Gauge* weight_bytes_ = nullptr;
  prometheus::Gauge* kv_bytes_ = nullptr;
};

}  // namespace moeshard
