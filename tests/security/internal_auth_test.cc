// The internal services refuse every call without the cluster credential: each method of
// the Worker and Coordinator services (found from the proto's descriptors, so a new method
// is covered as soon as it exists) answers UNAUTHENTICATED to a call without the token and
// to one with a wrong token, and has no effect; with the token (attached by
// CreateInternalChannel) the store works and refuses oversized entries.
#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <future>

#include "common/comm/kv_store.h"
#include "common/security/cluster_credential.h"
#include "common/security/internal_grpc.h"
#include "coordinator/coordinator_service.h"
#include "gtest/gtest.h"
#include "proto/moeshard.grpc.pb.h"
#include "tests/formats/format_test_util.h"
#include "worker/service/worker_service.h"

namespace moeshard {
namespace {

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

class InternalAuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(ConfigureInternalSecurity({kToken}).ok()); }

  void SetUp() override {
    worker_ = std::make_unique<WorkerServiceImpl>(WorkerOptions{.model_path = "/nonexistent"},
                                                  std::make_shared<prometheus::Registry>());
    coordinator_ = std::make_unique<CoordinatorServiceImpl>(nullptr, &store_);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", InternalServerCredentials(), &port);
    b.RegisterService(worker_.get());
    b.RegisterService(coordinator_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // Calls `method` (/package.Service/Method) with an empty request and `token` ("" = none).
  grpc::Status RawCall(const std::string& method, const std::string& token) {
    auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) ctx.AddMetadata(kClusterTokenMetadataKey, token);
    grpc::Slice empty(std::string{});  // an empty message (a default ByteBuffer is no message at all)
    grpc::ByteBuffer request(&empty, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) { done.set_value(s); });
    return done.get_future().get();
  }

  static std::vector<std::string> Methods() {
    std::vector<std::string> out;
    for (const char* name : {"moeshard.v1.Worker", "moeshard.v1.Coordinator"}) {
      const auto* service = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
      if (service == nullptr) continue;
      for (int i = 0; i < service->method_count(); ++i) out.push_back("/" + service->full_name() + "/" + service->method(i)->name());
    }
    return out;
  }

  InMemoryKvStore store_;
  std::unique_ptr<WorkerServiceImpl> worker_;
  std::unique_ptr<CoordinatorServiceImpl> coordinator_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(InternalAuthTest, EveryMethodRefusesCallsWithoutTheCredential) {
  const auto methods = Methods();
  ASSERT_EQ(methods.size(), 7u);  // Handshake, Step, Ping, Generate, GetStatus, StoreSet, StoreGet
  for (const std::string& m : methods) {
    for (const std::string& token : {std::string(), std::string("wrong-token-wrong-token"), std::string(kToken) + "x"}) {
      grpc::Status st = RawCall(m, token);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << m << " with token '" << token << "': " << st.error_message();
      EXPECT_EQ(st.error_message().find(kToken), std::string::npos);
    }
  }
}

TEST_F(InternalAuthTest, RefusedStoreCallsChangeNothing) {
  auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::StoreSetRequest req;
  req.set_key("group/rank/0");
  req.set_value("10.0.0.66:1");
  v1::StoreSetReply rep;
  EXPECT_EQ(stub->StoreSet(&ctx, req, &rep).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(store_.Get("group/rank/0", std::chrono::milliseconds(0)).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(InternalAuthTest, TheCredentialOpensTheStoreWithinItsLimits) {
  auto stub = v1::Coordinator::NewStub(CreateInternalChannel(address_, grpc::ChannelArguments()));
  {
    grpc::ClientContext ctx;
    v1::StoreSetRequest req;
    req.set_key("g/addr/0");
    req.set_value("127.0.0.1:5000");
    v1::StoreSetReply rep;
    ASSERT_TRUE(stub->StoreSet(&ctx, req, &rep).ok());
  }
  {
    grpc::ClientContext ctx;
    v1::StoreGetRequest req;
    req.set_key("g/addr/0");
    v1::StoreGetReply rep;
    ASSERT_TRUE(stub->StoreGet(&ctx, req, &rep).ok());
    EXPECT_EQ(rep.value(), "127.0.0.1:5000");
  }
  grpc::ClientContext ctx;
  v1::StoreSetRequest req;
  req.set_key("g/big");
  req.set_value(std::string(InMemoryKvStore::kMaxValueBytes + 1, 'x'));
  v1::StoreSetReply rep;
  EXPECT_EQ(stub->StoreSet(&ctx, req, &rep).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST(ClusterCredentialTest, GeneratedTokensAreLongAndDistinct) {
  auto a = GenerateClusterToken(), b = GenerateClusterToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_NE(*a, *b);
}

TEST(ClusterCredentialTest, LoadsFromEnvironmentOrFileAndRefusesWeakOnes) {
  unsetenv(kClusterTokenEnv);
  unsetenv(kClusterTokenFileEnv);
  EXPECT_EQ(LoadClusterToken("").status().code(), absl::StatusCode::kNotFound);
  test::TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Path("cluster-token");
  { std::ofstream(path) << "  file-token-0123456789\n"; }
  auto from_file = LoadClusterToken(path);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(*from_file, "file-token-0123456789");
  setenv(kClusterTokenFileEnv, path.c_str(), 1);
  EXPECT_EQ(*LoadClusterToken(""), "file-token-0123456789");
  setenv(kClusterTokenEnv, "weak-tok", 1);
  auto weak = LoadClusterToken("");
  EXPECT_EQ(weak.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(weak.status().message().find("weak-tok"), std::string::npos);  // never echoed
  setenv(kClusterTokenEnv, "env-token-0123456789", 1);
  EXPECT_EQ(*LoadClusterToken(path), "env-token-0123456789");
  unsetenv(kClusterTokenEnv);
  unsetenv(kClusterTokenFileEnv);
  EXPECT_FALSE(ConfigureInternalSecurity({"short"}).ok());
  EXPECT_FALSE(ConfigureInternalSecurity({kToken, "/nonexistent.pem"}).ok());
}

}  // namespace
}  // namespace moeshard
