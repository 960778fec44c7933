// Supervisor (cli/supervisor.h) with shell scripts standing in for moeshard's processes: they
// announce ports on their first line as the real ones do, then exit or sleep.
#include "cli/supervisor.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "gtest/gtest.h"
#include "httplib.h"

namespace moeshard {
namespace {

using std::chrono::milliseconds;

class SupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/moeshard-supervisor-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A script that appends its arguments to `args.log`, announces as a worker with the given
  // ports, then runs `then` (e.g. "exit 3", or "exec sleep 30": no grandchild may hold stdout open).
  std::string Script(int grpc_port, int metrics_port, const std::string& then) {
    const std::string path = dir_ + "/moeshard-worker";
    std::ofstream(path) << "#!/bin/sh\necho \"$@\" >> " << dir_ << "/args.log\n"
                        << "echo \"moeshard-worker: grpc 127.0.0.1:" << grpc_port
                        << " metrics http://127.0.0.1:" << metrics_port << "/metrics\"\n"
                        << then << "\n";
    chmod(path.c_str(), 0755);
    return path;
  }
  std::vector<std::string> ArgLines() {
    std::ifstream in(dir_ + "/args.log");
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  }
  // Ticks until `done` or the timeout; returns the first error.
  absl::Status TickUntil(Supervisor& s, const std::function<bool()>& done, milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      absl::Status st = s.Tick();
      if (!st.ok()) return st;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return absl::OkStatus();
  }

  std::string dir_;
};

SupervisorOptions FastProbes() {
  SupervisorOptions o;
  o.probe_interval = milliseconds(50);
  o.probe_timeout = milliseconds(200);
  o.probe_failures = 3;
  o.max_restarts = 3;
  return o;
}

TEST(SupervisorHelpersTest, PortOfAndSetFlag) {
  EXPECT_EQ(*PortOf("127.0.0.1:7000"), "7000");
  EXPECT_EQ(*PortOf("http://127.0.0.1:9400/metrics"), "9400");
  EXPECT_EQ(*PortOf("http://[::1]:81"), "81");
  EXPECT_FALSE(PortOf("localhost").ok());
  std::vector<std::string> argv = {"w", "--port", "0", "--model", "m"};
  SetFlag(argv, "--port", "7000");
  SetFlag(argv, "--metrics-port", "9400");
  EXPECT_EQ(argv, (std::vector<std::string>{"w", "--port", "7000", "--model", "m", "--metrics-port", "9400"}));
}

TEST_F(SupervisorTest, DeathBeforeReadyFailsWithTheReason) {
  Supervisor s(FastProbes());
  ASSERT_TRUE(s.Start(Role::kWorker, {Script(4242, 4343, "exit 3"), "--port", "0"}, 5).ok());
  absl::Status st = TickUntil(
      s, [] { return false; }, milliseconds(3000));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("exited with status 3 before the cluster was ready"), std::string::npos) << st;
  EXPECT_EQ(s.num_restarts(), 0);
}

TEST_F(SupervisorTest, DeadProcessRestartsOnItsAnnouncedPorts) {
  SupervisorOptions o = FastProbes();
  o.probe_interval = std::chrono::seconds(60);  // nothing serves the probe port: only the exit counts here
  Supervisor s(o);
  ASSERT_TRUE(s.Start(Role::kWorker, {Script(4242, 4343, "exec sleep 0.3"), "--port", "0"}, 5).ok());
  s.MarkReady();
  ASSERT_TRUE(TickUntil(
                  s, [&] { return s.num_restarts() >= 1; }, milliseconds(5000))
                  .ok());
  ASSERT_EQ(s.num_restarts(), 1);
  std::this_thread::sleep_for(milliseconds(100));
  std::vector<std::string> lines = ArgLines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "--port 0");
  EXPECT_EQ(lines[1], "--port 4242 --metrics-port 4343");
}

TEST_F(SupervisorTest, ProcessThatStopsAnsweringItsProbeIsKilledAndRestarted) {
  httplib::Server health;
  std::atomic<bool> healthy{true};
  health.Get("/health", [&](const httplib::Request&, httplib::Response& res) { res.status = healthy ? 200 : 500; });
  const int port = health.bind_to_any_port("127.0.0.1");
  std::thread server([&] { health.listen_after_bind(); });
  Supervisor s(FastProbes());
  ASSERT_TRUE(s.Start(Role::kWorker, {Script(4242, port, "exec sleep 30")}, 5).ok());
  s.MarkReady();
  // Healthy for a second: about 20 probes, no restart.
  ASSERT_TRUE(TickUntil(
                  s, [] { return false; }, milliseconds(1000))
                  .ok());
  EXPECT_EQ(s.num_restarts(), 0);
  healthy = false;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(TickUntil(
                  s, [&] { return s.num_restarts() >= 1; }, milliseconds(3000))
                  .ok());
  EXPECT_EQ(s.num_restarts(), 1);
  // Three failed probes 50 ms apart, then a 0.5 s backoff.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, milliseconds(2000));
  s.StopAll();
  health.stop();
  server.join();
}

TEST_F(SupervisorTest, CrashLoopFailsAfterMaxRestarts) {
  SupervisorOptions o = FastProbes();
  o.max_restarts = 2;
  Supervisor s(o);
  ASSERT_TRUE(s.Start(Role::kWorker, {Script(4242, 4343, "exit 1")}, 5).ok());
  s.MarkReady();
  absl::Status st = TickUntil(
      s, [] { return false; }, milliseconds(6000));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("3 deaths within 60 s"), std::string::npos) << st;
  EXPECT_EQ(s.num_restarts(), 2);
}

}  // namespace
}  // namespace moeshard
