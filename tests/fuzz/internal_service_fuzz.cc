// libFuzzer target: the internal gRPC services' real handlers, in-process, as a holder of the
// cluster credential could call them. Two servers on loopback: a worker the fuzzer drives
// directly (handshaken once for real: one rank, the whole test model qwen3moe-tiny, a small
// KV pool), and a coordinator (its Engine driving a second worker of its own, and its store).
// The first byte of an input picks the method, the rest is its parsed request:
//   0 Worker.Handshake  1 Worker.Step  2 Worker.Ping  3 Coordinator.Generate
//   4 Coordinator.GetStatus  5 Coordinator.StoreSet  6 Coordinator.StoreGet
// What the harness changes in a request, so that an input costs milliseconds, not minutes:
// a handshake's store is the coordinator's and its timeout at most 200 ms (a group of several
// ranks waits that long for peers that never come); a step id >= 0 is
// made the worker's next one (a later id would wait its turn; a negative one stays, and is
// refused as stale); a store read waits at
// most 20 ms; a generation has a 20 s deadline. A step that broke the worker's group is
// followed by a real handshake, so that the next input meets a working worker again.
// Needs $MOESHARD_TESTDATA (tests/fuzz/run.sh sets it).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/comm/kv_store.h"
#include "common/model/model_loader.h"
#include "common/security/internal_grpc.h"
#include "coordinator/coordinator_service.h"
#include "coordinator/engine.h"
#include "coordinator/grpc_worker_pool.h"
#include "coordinator/plan.h"
#include "prometheus/registry.h"
#include "proto/moeshard.grpc.pb.h"
#include "tests/fuzz/quiet_protobuf.h"
#include "worker/service/worker_service.h"

namespace moeshard {
namespace {

constexpr char kToken[] = "fuzz-cluster-token-0123456789abcdef";
constexpr int kBlocks = 64, kBlockSize = 16;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "internal_service_fuzz: %s\n", what.c_str());
  std::abort();
}

struct Server {
  std::unique_ptr<grpc::Server> server;
  std::string address;
  void Start(std::vector<grpc::Service*> services) {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", InternalServerCredentials(), &port);
    for (grpc::Service* s : services) b.RegisterService(s);
    server = b.BuildAndStart();
    if (!server || port == 0) Die("cannot listen on loopback");
    address = "127.0.0.1:" + std::to_string(port);
  }
};

class Harness {
 public:
  Harness() {
    if (!ConfigureInternalSecurity({.token = kToken}).ok()) Die("cannot configure the cluster credential");
    const char* testdata = std::getenv("MOESHARD_TESTDATA");
    if (testdata == nullptr) Die("set MOESHARD_TESTDATA (the build's testdata folder)");
    // qwen3moe-tiny: a vocabulary of 512 (qwen3moe-tok's 151,936-row LM head made every step
    // of the coverage-instrumented CPU forward pass take seconds).
    model_path_ = std::string(testdata) + "/qwen3moe-tiny";
    auto model = LoadModel(model_path_, /*load_tokenizer=*/false);
    if (!model.ok()) Die(std::string(model.status().message()));
    config_ = model->config;
    // The coordinator: engine, store, and the engine's own worker.
    engine_worker_ = std::make_unique<WorkerServiceImpl>(WorkerOptions{.model_path = model_path_},
                                                         std::make_shared<prometheus::Registry>());
    EngineOptions eo;
    eo.config = config_;
    auto plan = MakePlan(config_, ParallelMode::kLayerSplit, 1, {});
    if (!plan.ok()) Die(std::string(plan.status().message()));
    eo.plan = *plan;
    eo.num_kv_blocks = kBlocks;
    eo.block_size = kBlockSize;
    eo.max_num_seqs = 8;
    eo.max_tokens_per_step = 256;
    eo.max_model_len = 256;
    eo.comm_timeout_ms = 5000;
    eo.model_name = "fuzz";
    engine_options_ = eo;
    StartCoordinator();
    // The worker the fuzzer drives.
    worker_ = std::make_unique<WorkerServiceImpl>(WorkerOptions{.model_path = model_path_},
                                                  std::make_shared<prometheus::Registry>());
    worker_server_.Start({worker_.get()});
    worker_stub_ = v1::Worker::NewStub(CreateInternalChannel(worker_server_.address, grpc::ChannelArguments()));
    coordinator_stub_ = v1::Coordinator::NewStub(CreateInternalChannel(coordinator_server_.address, grpc::ChannelArguments()));
    Handshake(GoodHandshake());
  }

  void Run(const uint8_t* data, size_t size) {
    const uint8_t* body = data + 1;
    const int n = static_cast<int>(size - 1);
    switch (data[0] % 7) {
      case 0: {
        v1::HandshakeRequest req;
        if (!req.ParseFromArray(body, n)) return;
        req.set_store_address(coordinator_server_.address);
        if (req.timeout_ms() > 200 || req.timeout_ms() <= 0) req.set_timeout_ms(200);
        Handshake(req);
        if (!WorkerServes()) Handshake(GoodHandshake());
        break;
      }
      case 1: {
        v1::StepRequest req;
        if (!req.ParseFromArray(body, n)) return;
        if (req.step_id() >= 0) req.set_step_id(NextStep());
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
        v1::StepReply rep;
        (void)worker_stub_->Step(&ctx, req, &rep);
        if (!WorkerServes()) Handshake(GoodHandshake());
        break;
      }
      case 2: {
        grpc::ClientContext ctx;
        v1::PingRequest req;
        v1::PingReply rep;
        (void)req.ParseFromArray(body, n);
        (void)worker_stub_->Ping(&ctx, req, &rep);
        break;
      }
      case 3: {
        v1::SeqRequest req;
        if (!req.ParseFromArray(body, n)) return;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
        auto reader = coordinator_stub_->Generate(&ctx, req);
        v1::SeqUpdate u;
        while (reader->Read(&u)) {
        }
        (void)reader->Finish();
        break;
      }
      case 4: {
        grpc::ClientContext ctx;
        v1::StatusRequest req;
        v1::StatusReply rep;
        (void)req.ParseFromArray(body, n);
        (void)coordinator_stub_->GetStatus(&ctx, req, &rep);
        break;
      }
      case 5: {
        v1::StoreSetRequest req;
        if (!req.ParseFromArray(body, n)) return;
        grpc::ClientContext ctx;
        v1::StoreSetReply rep;
        (void)coordinator_stub_->StoreSet(&ctx, req, &rep);
        break;
      }
      default: {
        v1::StoreGetRequest req;
        if (!req.ParseFromArray(body, n)) return;
        req.set_timeout_ms(std::clamp<int64_t>(req.timeout_ms(), 0, 20));
        grpc::ClientContext ctx;
        v1::StoreGetReply rep;
        (void)coordinator_stub_->StoreGet(&ctx, req, &rep);
        break;
      }
    }
  }

 private:
  void StartCoordinator() {
    // Bind with a late-bound engine (as coordinator_main does): the engine needs the address.
    service_holder_ = std::make_unique<LateCoordinator>();
    coordinator_server_.Start({service_holder_.get(), engine_worker_.get()});
    engine_options_.store_address = coordinator_server_.address;
    engine_ = std::make_unique<Engine>(
        engine_options_, std::make_unique<GrpcWorkerPool>(std::vector<std::string>{coordinator_server_.address}));
    service_holder_->impl = std::make_unique<CoordinatorServiceImpl>(engine_.get(), &store_);
    engine_->Start();
    for (int i = 0; i < 600 && !engine_->GetStatus().ready; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!engine_->GetStatus().ready) Die("the coordinator's engine did not become ready");
  }

  // Forwards to the service made once the engine exists.
  struct LateCoordinator final : v1::Coordinator::Service {
    std::unique_ptr<CoordinatorServiceImpl> impl;
    grpc::Status Generate(grpc::ServerContext* c, const v1::SeqRequest* r, grpc::ServerWriter<v1::SeqUpdate>* w) override {
      return impl->Generate(c, r, w);
    }
    grpc::Status GetStatus(grpc::ServerContext* c, const v1::StatusRequest* r, v1::StatusReply* p) override {
      return impl->GetStatus(c, r, p);
    }
    grpc::Status StoreSet(grpc::ServerContext* c, const v1::StoreSetRequest* r, v1::StoreSetReply* p) override {
      return impl->StoreSet(c, r, p);
    }
    grpc::Status StoreGet(grpc::ServerContext* c, const v1::StoreGetRequest* r, v1::StoreGetReply* p) override {
      return impl->StoreGet(c, r, p);
    }
  };

  v1::HandshakeRequest GoodHandshake() {
    v1::HandshakeRequest r;
    r.set_protocol_version(kProtocolVersion);
    r.set_model_fingerprint(config_.Fingerprint());
    r.set_worker_index(0);
    r.set_num_workers(1);
    v1::ShardProto* s = r.mutable_shard();
    s->set_layer_begin(0);
    s->set_layer_end(config_.num_layers);
    s->set_tp_size(1);
    s->set_pp_size(1);
    s->set_first_stage(true);
    s->set_last_stage(true);
    r.set_store_address(coordinator_server_.address);
    r.set_group_id("fuzz-" + std::to_string(++groups_));
    r.set_num_kv_blocks(kBlocks);
    r.set_block_size(kBlockSize);
    r.set_timeout_ms(2000);
    return r;
  }

  void Handshake(const v1::HandshakeRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::HandshakeReply rep;
    (void)worker_stub_->Handshake(&ctx, req, &rep);
  }

  // The worker's next step id, from the refusal of a stale one ("... (next is N)"); -1 when
  // the worker has no plan.
  int64_t NextStep() {
    grpc::ClientContext ctx;
    v1::StepRequest probe;
    probe.set_step_id(-1);
    v1::StepReply rep;
    grpc::Status st = worker_stub_->Step(&ctx, probe, &rep);
    static const std::regex next(R"(next is (-?\d+))");
    std::smatch m;
    const std::string msg = st.error_message();
    return std::regex_search(msg, m, next) ? std::stoll(m[1]) : -1;
  }

  // Whether the worker would run its next step (it has a plan and its group is not broken).
  bool WorkerServes() {
    const int64_t next = NextStep();
    if (next < 0) return false;
    grpc::ClientContext ctx;
    v1::StepRequest empty;
    empty.set_step_id(next);
    v1::StepReply rep;
    return worker_stub_->Step(&ctx, empty, &rep).ok();
  }

  std::string model_path_;
  ModelConfig config_;
  EngineOptions engine_options_;
  InMemoryKvStore store_;
  std::unique_ptr<WorkerServiceImpl> engine_worker_, worker_;
  std::unique_ptr<LateCoordinator> service_holder_;
  std::unique_ptr<Engine> engine_;
  Server coordinator_server_, worker_server_;
  std::unique_ptr<v1::Worker::Stub> worker_stub_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_stub_;
  int groups_ = 0;
};

}  // namespace
}  // namespace moeshard

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  moeshard::fuzz::QuietProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static moeshard::Harness* harness = new moeshard::Harness();  // lives until exit
  harness->Run(data, size);
  return 0;
}
