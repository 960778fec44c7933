// MOESHARD_REPEAT_OPS (worker/gpu/runner_repeat.h): names to bits; an unknown name is refused
// with a message that lists the known ones.
#include "worker/gpu/runner_repeat.h"

#include "gtest/gtest.h"

namespace moeshard::gpu_runner {
namespace {

TEST(RepeatOpsTest, NamesToBits) {
  auto m = ParseRepeatOps("qkv,experts");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m, uint32_t{kRepeatQkv | kRepeatExperts});
  m = ParseRepeatOps("");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, 0u);
  m = ParseRepeatOps("attention,,lmhead,o,router,routing");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, uint32_t{kRepeatAttention | kRepeatLmHead | kRepeatO | kRepeatRouter | kRepeatRouting});
}

TEST(RepeatOpsTest, UnknownNameRefused) {
  auto m = ParseRepeatOps("qkv,mlp");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("\"mlp\""), absl::string_view::npos) << m.status();
  EXPECT_NE(m.status().message().find("known: qkv"), absl::string_view::npos) << m.status();
}

}  // namespace
}  // namespace moeshard::gpu_runner
