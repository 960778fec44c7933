// The moeshard-router binary as a launcher runs it: it prints one line with both ports,
// serves, and exits 0 on SIGTERM. Skipped when the binary is not built.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "router_test_util.h"

namespace moeshard::router::testing {
namespace {

using Json = nlohmann::json;

std::string RouterBinary() {
  const char* bin = std::getenv("MOESHARD_BIN");
  return std::string(bin != nullptr ? bin : ".") + "/moeshard-router";
}

// Starts the binary with `args`; its stdout is a pipe read by the caller.
pid_t Spawn(const std::vector<std::string>& args, int* stdout_fd) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    std::string bin = RouterBinary();
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  *stdout_fd = fds[0];
  return pid;
}

std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

// Waits up to `timeout_ms` for the child; returns its exit code, or -1.
int WaitExit(pid_t pid, int timeout_ms) {
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

class RouterProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(RouterBinary().c_str(), X_OK) != 0) GTEST_SKIP() << "no binary at " << RouterBinary();
    // The child inherits the cluster credential (the fake coordinator does not check it).
    setenv("MOESHARD_CLUSTER_TOKEN", "router-process-test-token", 1);
  }
  void TearDown() override { unsetenv("MOESHARD_CLUSTER_TOKEN"); }
};

TEST_F(RouterProcessTest, PrintsPortsServesAndStopsOnSigterm) {
  FakeCoordinator fake;
  const std::string address = fake.Start();
  int out = -1;
  const pid_t pid = Spawn({"--coordinator", address, "--port", "0", "--grpc-port=0", "--served-model-name", "m"}, &out);
  ASSERT_GT(pid, 0);
  const std::string line = ReadLine(out);
  std::smatch m;
  ASSERT_TRUE(
      std::regex_match(line, m, std::regex(R"(moeshard-router: http://127\.0\.0\.1:(\d+) grpc 127\.0\.0\.1:(\d+))")))
      << "banner: '" << line << "'";
  const int port = std::stoi(m[1]);
  EXPECT_GT(std::stoi(m[2]), 0);
  httplib::Client cli("127.0.0.1", port);
  EXPECT_EQ(cli.Get("/health")->status, 200);
  bool ready = false;
  for (int i = 0; i < 500 && !ready; ++i) {
    auto res = cli.Get("/ready");
    ready = res && res->status == 200;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(ready);
  // Without --model there is no tokenizer: token ids work, text is refused.
  auto res =
      cli.Post("/v1/completions", Json{{"prompt", {1, 2, 3}}, {"max_tokens", 2}, {"return_token_ids", true}}.dump(),
               "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(Json::parse(res->body)["choices"][0]["token_ids"], Json({1, 2}));
  res = cli.Post("/v1/completions", Json{{"prompt", "text"}}.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_THAT(res->body, ::testing::HasSubstr("tokenizer"));
  kill(pid, SIGTERM);
  EXPECT_EQ(WaitExit(pid, 10000), 0);
  close(out);
}

TEST_F(RouterProcessTest, RefusesToStartWithoutTheClusterCredential) {
  unsetenv("MOESHARD_CLUSTER_TOKEN");
  int out = -1;
  pid_t pid = Spawn({"--coordinator", "127.0.0.1:1", "--port", "0"}, &out);
  EXPECT_EQ(WaitExit(pid, 5000), 2);
  close(out);
  setenv("MOESHARD_CLUSTER_TOKEN", "short", 1);
  pid = Spawn({"--coordinator", "127.0.0.1:1", "--port", "0"}, &out);
  EXPECT_EQ(WaitExit(pid, 5000), 2);
  close(out);
}

TEST_F(RouterProcessTest, BadFlagsExitWithUsage) {
  int out = -1;
  pid_t pid = Spawn({"--port", "0"}, &out);  // neither --pools nor --coordinator
  EXPECT_EQ(WaitExit(pid, 5000), 2);
  close(out);
  pid = Spawn({"--coordinator", "x:1", "--bogus", "1"}, &out);
  EXPECT_EQ(WaitExit(pid, 5000), 2);
  close(out);
  pid = Spawn({"--pools", "/nonexistent.json"}, &out);
  EXPECT_EQ(WaitExit(pid, 5000), 1);
  close(out);
}

}  // namespace
}  // namespace moeshard::router::testing
