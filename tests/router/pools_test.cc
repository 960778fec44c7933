// Pools config parsing and the dispatch choice (smallest fitting ready pool, then the
// least-loaded ready coordinator), with hand-computed answers.
#include "router/pools.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/api_error.h"

namespace moeshard::router {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(PoolsConfigTest, ParsesAndSortsByLength) {
  auto pools = ParsePoolsConfig(R"({"pools": [
      {"name": "128k", "max_model_len": 131072, "coordinators": ["10.0.0.2:5000"]},
      {"name": "32k", "max_model_len": 32768, "coordinators": ["10.0.0.1:5000", "10.0.0.1:5001"]}]})");
  ASSERT_TRUE(pools.ok()) << pools.status();
  ASSERT_EQ(pools->size(), 2u);
  EXPECT_EQ((*pools)[0].name, "32k");
  EXPECT_EQ((*pools)[0].max_model_len, 32768);
  EXPECT_THAT((*pools)[0].coordinators, ElementsAre("10.0.0.1:5000", "10.0.0.1:5001"));
  EXPECT_EQ((*pools)[1].name, "128k");
  // Without max_model_len the pool takes what its coordinators report (0 here).
  auto reported = ParsePoolsConfig(
      R"({"pools": [{"name": "p", "coordinators": ["a:1"]}, {"name": "q", "max_model_len": 0, "coordinators": ["a:2"]}]})");
  ASSERT_TRUE(reported.ok()) << reported.status();
  EXPECT_EQ((*reported)[0].max_model_len, 0);
  EXPECT_EQ((*reported)[1].max_model_len, 0);
}

TEST(PoolsConfigTest, BadConfigsNameTheProblem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"not json", "not valid JSON"},
      {R"({"pools": []})", "at least one pool"},
      {R"({"pool": [{}]})", "at least one pool"},
      {R"({"pools": [5]})", "pools[0] must be an object"},
      {R"({"pools": [{"max_model_len": 10, "coordinators": ["a:1"]}]})", "pools[0].name"},
      {R"({"pools": [{"name": "p", "max_model_len": -1, "coordinators": ["a:1"]}]})", "pool 'p': max_model_len"},
      {R"({"pools": [{"name": "p", "max_model_len": "8", "coordinators": ["a:1"]}]})", "pool 'p': max_model_len"},
      {R"({"pools": [{"name": "p", "max_model_len": 8, "coordinators": []}]})", "pool 'p': coordinators"},
      {R"({"pools": [{"name": "p", "max_model_len": 8, "coordinators": [7]}]})", "pool 'p': coordinators"},
      {R"({"pools": [{"name": "p", "max_model_len": 8, "coordinators": ["a:1"]},
                     {"name": "p", "max_model_len": 9, "coordinators": ["a:2"]}]})",
       "appears twice"},
      {R"({"pools": [{"name": "p", "max_model_len": 8, "coordinators": ["a:1"]},
                     {"name": "q", "max_model_len": 9, "coordinators": ["a:1"]}]})",
       "a:1 appears twice"},
  };
  for (const auto& [text, part] : cases) {
    auto pools = ParsePoolsConfig(text);
    ASSERT_FALSE(pools.ok()) << text;
    EXPECT_EQ(pools.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(pools.status().message()), HasSubstr(part)) << text;
  }
  EXPECT_EQ(LoadPoolsConfig("/nonexistent/pools.json").status().code(), absl::StatusCode::kNotFound);
}

CoordinatorView Ready(int64_t load, int64_t len = 0) {
  return {.ready = true, .load_tokens = load, .max_model_len = len};
}
CoordinatorView Down() { return {.ready = false, .load_tokens = 0}; }

// Pools of 1000 and 4000 tokens.
std::vector<PoolView> TwoPools(std::vector<CoordinatorView> small, std::vector<CoordinatorView> large) {
  return {PoolView{.max_model_len = 1000, .coordinators = std::move(small)},
          PoolView{.max_model_len = 4000, .coordinators = std::move(large)}};
}

TEST(DispatchTest, SmallestFittingPool) {
  auto pools = TwoPools({Ready(0)}, {Ready(0)});
  auto c = ChooseDispatch(pools, 100, 900);  // exactly 1000: fits the small pool
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pool_idx, 0u);
  EXPECT_EQ(c->max_tokens, 900);
  c = ChooseDispatch(pools, 100, 901);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pool_idx, 1u);
}

TEST(DispatchTest, PoolOrderDoesNotMatter) {
  std::vector<PoolView> pools = {PoolView{.max_model_len = 4000, .coordinators = {Ready(0)}},
                                 PoolView{.max_model_len = 1000, .coordinators = {Ready(0)}}};
  auto c = ChooseDispatch(pools, 10, 10);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pool_idx, 1u);
}

TEST(DispatchTest, DefaultMaxTokensFillsTheChosenContext) {
  auto pools = TwoPools({Ready(0)}, {Ready(0)});
  auto c = ChooseDispatch(pools, 300, std::nullopt);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pool_idx, 0u);
  EXPECT_EQ(c->max_tokens, 700);
  c = ChooseDispatch(pools, 1000, std::nullopt);  // no room left in the small pool
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pool_idx, 1u);
  EXPECT_EQ(c->max_tokens, 3000);
  // A coordinator reporting a shorter context than its pool limits the fill.
  auto limited = TwoPools({Ready(0, 800)}, {Ready(0)});
  c = ChooseDispatch(limited, 300, std::nullopt);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pool_idx, 0u);
  EXPECT_EQ(c->max_tokens, 500);
}

TEST(DispatchTest, LeastLoadedReadyCoordinator) {
  auto pools = TwoPools({Ready(500), Down(), Ready(20), Ready(30)}, {Ready(0)});
  auto c = ChooseDispatch(pools, 10, 10);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pool_idx, 0u);
  EXPECT_EQ(c->coordinator_idx, 2u);
  // Ties go to the first.
  pools = TwoPools({Ready(7), Ready(7)}, {});
  c = ChooseDispatch(pools, 10, 10);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->coordinator_idx, 0u);
}

CoordinatorView Full(int64_t load) { return {.ready = true, .load_tokens = load, .queue_full = true}; }

TEST(DispatchTest, PrefersCoordinatorsWithRoomInAnyFittingPool) {
  // The least loaded coordinator of the small pool is full: its other one takes the request.
  auto pools = TwoPools({Full(0), Ready(900)}, {Ready(0)});
  auto c = ChooseDispatch(pools, 10, 10);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pool_idx, 0u);
  EXPECT_EQ(c->coordinator_idx, 1u);
  // The whole small pool is full: a larger pool with room beats it.
  pools = TwoPools({Full(0), Full(0)}, {Ready(5000)});
  c = ChooseDispatch(pools, 10, 10);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pool_idx, 1u);
  // Everything is full: the least loaded full coordinator decides (and may refuse).
  pools = TwoPools({Full(50), Full(40)}, {Full(10), Down()});
  c = ChooseDispatch(pools, 10, 10);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pool_idx, 0u);
  EXPECT_EQ(c->coordinator_idx, 1u);
}

TEST(DispatchTest, SkipsPoolsWithoutReadyCoordinators) {
  auto pools = TwoPools({Down(), Down()}, {Ready(10000)});
  auto c = ChooseDispatch(pools, 10, 10);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pool_idx, 1u);
  // A coordinator whose own context is too short is skipped too.
  pools = TwoPools({Ready(0, 500)}, {Ready(0)});
  c = ChooseDispatch(pools, 400, 200);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->pool_idx, 1u);
}

TEST(DispatchTest, TooLongForEveryPoolNamesBothCounts) {
  auto pools = TwoPools({Ready(0)}, {Ready(0)});
  auto c = ChooseDispatch(pools, 3000, 1001);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorCode(c.status()), "context_length_exceeded");
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("maximum context length is 4000 tokens"));
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("4001 tokens (3000 in the prompt, 1001 for the completion)"));
  c = ChooseDispatch(pools, 4000, std::nullopt);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(ErrorCode(c.status()), "context_length_exceeded");
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("your prompt has 4000 tokens"));
  // Even when nothing is ready, a request too long for every pool is the client's error.
  c = ChooseDispatch(TwoPools({Down()}, {Down()}), 5000, 1);
  EXPECT_EQ(ErrorCode(c.status()), "context_length_exceeded");
}

TEST(DispatchTest, NothingReadyIsUnavailable) {
  auto c = ChooseDispatch(TwoPools({Down()}, {Down()}), 10, 10);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  // Fits only the large pool, whose coordinator is down, while the small one is ready.
  c = ChooseDispatch(TwoPools({Ready(0)}, {Down()}), 10, 2000);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  // No pool length known yet (single-coordinator mode before the first poll).
  std::vector<PoolView> unknown = {PoolView{.max_model_len = 0, .coordinators = {Down()}}};
  EXPECT_EQ(ChooseDispatch(unknown, 10, 10).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ChooseDispatch({}, 10, 10).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace moeshard::router
