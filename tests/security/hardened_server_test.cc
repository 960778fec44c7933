// The hardened HTTP server (common/http/hardened_server.h) against clients that hold
// connections: slow heads are cut at the read deadline, connections past the per-client cap
// are probe-only (the probe answers, anything else gets 503), and the probes answer while
// every worker thread is held.
#include "common/http/hardened_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "gtest/gtest.h"

namespace moeshard {
namespace {

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

class HardenedServerTest : public ::testing::Test {
 protected:
  void Start(ConnectionLimits limits) {
    auto s = MakeHardenedServer(limits);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    server_->set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
      return RefuseOutsideProbes(req, res) ? httplib::Server::HandlerResponse::Handled : httplib::Server::HandlerResponse::Unhandled;
    });
    server_->Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok", "text/plain"); });
    server_->Get("/work", [](const httplib::Request&, httplib::Response& res) { res.set_content("done", "text/plain"); });
    port_ = server_->bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    thread_ = std::thread([this] { server_->listen_after_bind(); });
    while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void TearDown() override {
    for (int fd : slow_) close(fd);
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  // `n` connections that send half a request head and then nothing.
  void HoldConnections(int n) {
    for (int i = 0; i < n; ++i) {
      int fd = Connect(port_);
      ASSERT_GE(fd, 0);
      ASSERT_EQ(send(fd, "GET /work HTTP/1.1\r\nHo", 22, 0), 22);
      slow_.push_back(fd);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  httplib::Result Get(const char* path) {
    httplib::Client cli("127.0.0.1", port_);
    cli.set_read_timeout(3, 0);
    return cli.Get(path);
  }

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::vector<int> slow_;
};

TEST_F(HardenedServerTest, ProbesAnswerWhileSlowClientsHoldEveryThread) {
  ConnectionLimits l;
  l.num_threads = 4;
  l.num_probe_threads = 2;
  l.max_per_client = 100;
  l.max_connections = 100;
  l.request_read_timeout_s = 30;
  Start(l);
  HoldConnections(4);  // every worker thread waits for the rest of a head
  const auto t0 = std::chrono::steady_clock::now();
  auto res = Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  res = Get("/work");  // taken by a spare thread: probes only
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
}

TEST_F(HardenedServerTest, PastThePerClientCapOnlyProbesAnswer) {
  ConnectionLimits l;
  l.num_threads = 16;
  l.max_per_client = 3;
  l.request_read_timeout_s = 30;
  Start(l);
  HoldConnections(3);
  auto res = Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  res = Get("/work");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  for (int fd : slow_) close(fd);
  slow_.clear();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  res = Get("/work");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
}

TEST_F(HardenedServerTest, ASlowHeadIsCutAtTheReadDeadline) {
  ConnectionLimits l;
  l.num_threads = 4;
  l.request_read_timeout_s = 1;
  Start(l);
  int fd = Connect(port_);
  ASSERT_GE(fd, 0);
  const auto t0 = std::chrono::steady_clock::now();
  const char head[] = "GET /work HTTP/1.1\r\nHost: x\r\n";
  // One byte every 100 ms: each read is quick, the head as a whole is not.
  bool closed = false;
  for (size_t i = 0; i < 40 && !closed; ++i) {
    closed = send(fd, head + i % (sizeof(head) - 1), 1, MSG_NOSIGNAL) < 0;
    char c;
    closed = closed || recv(fd, &c, 1, MSG_DONTWAIT) == 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  close(fd);
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2500));
}

// HTTPS (--tls-cert/--tls-key) through the same connection loop: a TLS client gets answers,
// a plaintext one does not.
TEST_F(HardenedServerTest, ServesTlsWithACertificateFromFiles) {
  const std::string d = ::testing::TempDir() + "/moeshard-https";
  const std::string make = "rm -rf " + d + " && mkdir -p " + d + " && openssl req -x509 -newkey rsa:2048 -nodes -keyout " + d +
                           "/key.pem -out " + d + "/cert.pem -days 1 -subj /CN=localhost 2>/dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0);
  ConnectionLimits l;
  l.num_threads = 4;
  l.tls_cert_file = d + "/cert.pem";
  l.tls_key_file = d + "/key.pem";
  Start(l);
  httplib::SSLClient tls("127.0.0.1", port_);
  tls.enable_server_certificate_verification(false);
  tls.set_read_timeout(3, 0);
  for (int i = 0; i < 3; ++i) {  // keep-alive: several requests on one TLS connection
    auto res = tls.Get("/work");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->body, "done");
  }
  EXPECT_FALSE(Get("/health"));
  l.tls_key_file = d + "/missing.pem";
  EXPECT_FALSE(MakeHardenedServer(l).ok());
}

}  // namespace
}  // namespace moeshard
