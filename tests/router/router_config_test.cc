// Command-line flags of moeshard-router: defaults, both flag forms, the key file, errors.
#include "router/router_config.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moeshard::router {
namespace {

using ::testing::HasSubstr;

TEST(RouterFlagsTest, DefaultsAndValues) {
  auto c = ParseRouterFlags({"--coordinator", "10.0.0.1:7000"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->host, "127.0.0.1");
  EXPECT_EQ(c->http_port, 0);
  EXPECT_EQ(c->grpc_port, 0);
  EXPECT_EQ(c->coordinator, "10.0.0.1:7000");
  EXPECT_EQ(c->served_model_name, "moeshard");
  EXPECT_EQ(c->poll_interval, absl::Milliseconds(250));

  c = ParseRouterFlags({"--pools=/p.json", "--host", "0.0.0.0", "--port", "8000", "--grpc-port=8001", "--model", "/m",
                        "--api-key", "k", "--http-threads", "8", "--poll-interval-ms", "100", "--drain-timeout-s",
                        "3"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pools_path, "/p.json");
  EXPECT_EQ(c->host, "0.0.0.0");
  EXPECT_EQ(c->http_port, 8000);
  EXPECT_EQ(c->grpc_port, 8001);
  EXPECT_EQ(c->served_model_name, "/m");  // the model path, as vLLM does
  EXPECT_EQ(c->api_key, "k");
  EXPECT_EQ(c->http_threads, 8);
  EXPECT_EQ(c->poll_interval, absl::Milliseconds(100));
  EXPECT_EQ(c->drain_timeout, absl::Seconds(3));
  EXPECT_THAT(DescribeConfig(*c), ::testing::Not(HasSubstr("api_key=k")));

  c = ParseRouterFlags({"--coordinator", "a:1", "--model", "/m", "--served-model-name", "name"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->served_model_name, "name");
}

TEST(RouterFlagsTest, KeyFileIsTrimmed) {
  const std::string path = ::testing::TempDir() + "/router_key.txt";
  std::ofstream(path) << "  s3cret\n";
  auto c = ParseRouterFlags({"--coordinator", "a:1", "--api-key-file", path});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->api_key, "s3cret");
  std::ofstream(path) << "\n";
  EXPECT_THAT(std::string(ParseRouterFlags({"--coordinator", "a:1", "--api-key-file", path}).status().message()),
              HasSubstr("empty"));
  std::remove(path.c_str());
}

TEST(RouterFlagsTest, Errors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "exactly one of --pools"},
      {{"--pools", "p", "--coordinator", "a:1"}, "exactly one of --pools"},
      {{"--coordinator"}, "needs a value"},
      {{"--coordinator", "a:1", "--bogus", "1"}, "unknown flag --bogus"},
      {{"--coordinator", "a:1", "stray"}, "unexpected argument"},
      {{"--coordinator", "a:1", "--port", "70000"}, "--port needs an integer"},
      {{"--coordinator", "a:1", "--port", "x"}, "--port needs an integer"},
      {{"--coordinator", "a:1", "--api-key", "a", "--api-key-file", "f"}, "at most one"},
      {{"--coordinator", "a:1", "--api-key", ""}, "must not be empty"},
      {{"--coordinator", "a:1", "--api-key-file", "/nonexistent/key"}, "cannot read"},
  };
  for (const auto& [args, part] : cases) {
    auto c = ParseRouterFlags(args);
    ASSERT_FALSE(c.ok()) << part;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(part));
  }
}

}  // namespace
}  // namespace moeshard::router
