// Mutual TLS between the internal services (--internal-tls-*): with certificates from a test
// CA (made here with the openssl command), a channel from CreateInternalChannel works, and a
// plaintext client or a TLS client without a certificate of that CA cannot even connect.
#include <cstdlib>
#include <fstream>

#include <grpcpp/grpcpp.h>

#include "common/comm/kv_store.h"
#include "common/security/internal_grpc.h"
#include "coordinator/coordinator_service.h"
#include "gtest/gtest.h"

namespace moeshard {
namespace {

constexpr char kMtlsToken[] = "mtls-test-token-0123456789abcdef";

std::string Dir() { return ::testing::TempDir() + "/moeshard-mtls"; }

class MtlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string d = Dir();
    const std::string script =
        "set -e; rm -rf " + d + "; mkdir -p " + d + "; cd " + d + "; " +
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=moeshard-test-ca 2>/dev/null; "
        "openssl req -newkey rsa:2048 -nodes -keyout node.key -out node.csr -subj /CN=node 2>/dev/null; "
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ext; "
        "openssl x509 -req -in node.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out node.crt -days 1 -extfile ext 2>/dev/null; "
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.crt -days 1 -subj /CN=other "
        "-addext subjectAltName=IP:127.0.0.1 2>/dev/null";
    ASSERT_EQ(std::system(("bash -c \"" + script + "\"").c_str()), 0) << "openssl failed";
  }

  void SetUp() override {
    const std::string d = Dir();
    ASSERT_TRUE(ConfigureInternalSecurity({kMtlsToken, d + "/node.crt", d + "/node.key", d + "/ca.crt"}).ok());
    service_ = std::make_unique<CoordinatorServiceImpl>(nullptr, &store_);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", InternalServerCredentials(), &port);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
    // Back to the token alone, as the other tests of this binary expect.
    ASSERT_TRUE(ConfigureInternalSecurity({"0123456789abcdef0123456789abcdef"}).ok());
  }

  static grpc::Status Set(const std::shared_ptr<grpc::Channel>& channel, bool with_token) {
    auto stub = v1::Coordinator::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (with_token) ctx.AddMetadata("x-moeshard-cluster-token", kMtlsToken);
    v1::StoreSetRequest req;
    req.set_key("k");
    req.set_value("v");
    v1::StoreSetReply rep;
    return stub->StoreSet(&ctx, req, &rep);
  }
  static std::string Read(const std::string& name) {
    std::ifstream in(Dir() + "/" + name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  InMemoryKvStore store_;
  std::unique_ptr<CoordinatorServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(MtlsTest, OnlyClientsWithACertificateOfTheCaConnect) {
  EXPECT_TRUE(Set(CreateInternalChannel(address_, grpc::ChannelArguments()), false).ok());
  EXPECT_EQ(*store_.Get("k", std::chrono::milliseconds(0)), "v");
  // Plaintext: the TLS handshake never happens.
  EXPECT_EQ(Set(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()), true).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // TLS that trusts the server, with no client certificate, or one from another CA.
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = Read("ca.crt");
  EXPECT_NE(Set(grpc::CreateChannel(address_, grpc::SslCredentials(no_cert)), true).error_code(), grpc::StatusCode::OK);
  grpc::SslCredentialsOptions other = no_cert;
  other.pem_private_key = Read("other.key");
  other.pem_cert_chain = Read("other.crt");
  EXPECT_NE(Set(grpc::CreateChannel(address_, grpc::SslCredentials(other)), true).error_code(), grpc::StatusCode::OK);
  // Over TLS the token is still required.
  grpc::SslCredentialsOptions good = no_cert;
  good.pem_private_key = Read("node.key");
  good.pem_cert_chain = Read("node.crt");
  EXPECT_EQ(Set(grpc::CreateChannel(address_, grpc::SslCredentials(good)), false).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Set(grpc::CreateChannel(address_, grpc::SslCredentials(good)), true).ok());
}

}  // namespace
}  // namespace moeshard
