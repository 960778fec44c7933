// The metrics server (common/metrics/metrics.h): it serves its registry, and it stops at once
// even when stopped right after it started — a process that fails just after starting it (a
// refused flag) must exit, not wait on its listener (httplib's stop() does nothing before the
// accept loop runs; a worker given `--kv-dtype fp8` on the CPU hung `moeshard up` that way).
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>

#include "common/metrics/metrics.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace moeshard {
namespace {

TEST(MetricsServerTest, StopsRightAfterStart) {
  for (int i = 0; i < 20; ++i) {
    auto done = std::async(std::launch::async, [] {
      MetricsServer server;
      auto port = server.Start("127.0.0.1", 0, std::make_shared<prometheus::Registry>());
      if (!port.ok()) return false;
      server.Stop();
      return true;
    });
    if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      ADD_FAILURE() << "Stop() right after Start() did not return within 10 s (round " << i << ")";
      std::quick_exit(1);  // the server's thread cannot be joined: leave without destructors
    }
    EXPECT_TRUE(done.get()) << "round " << i;
  }
}

TEST(MetricsServerTest, ServesTheRegistryAndHealth) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("moeshard_test_total")
      .Help("a test counter")
      .Register(*registry)
      .Add({})
      .Increment(3);
  MetricsServer server;
  auto port = server.Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Client cli("127.0.0.1", *port);
  auto m = cli.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  EXPECT_NE(m->body.find("moeshard_test_total 3"), std::string::npos) << m->body;
  auto h = cli.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(h->body, "ok\n");
  server.Stop();
}

}  // namespace
}  // namespace moeshard
