// What a worker puts into a lookahead (follow) chunk: only the token the sequence drew in the
// step just before; anything else is refused.
#include "worker/follow_tokens.h"

#include "gtest/gtest.h"

namespace moeshard {
namespace {

TEST(FollowTokensTest, OnlyTheDrawOfTheStepBefore) {
  FollowTokens f;
  EXPECT_EQ(f.Resolve(1, 7).status().code(), absl::StatusCode::kFailedPrecondition);  // never drew
  f.Record(4, 7, 1234);
  f.Record(4, 8, 99);
  ASSERT_TRUE(f.Resolve(5, 7).ok());
  EXPECT_EQ(*f.Resolve(5, 7), 1234);
  EXPECT_EQ(*f.Resolve(5, 8), 99);
  EXPECT_FALSE(f.Resolve(6, 7).ok());  // a step in between drew nothing for it
  EXPECT_FALSE(f.Resolve(4, 7).ok());  // not its own step
  f.Record(5, 7, 42);                  // the next draw replaces the last
  EXPECT_EQ(*f.Resolve(6, 7), 42);
  f.Forget(7);
  EXPECT_FALSE(f.Resolve(6, 7).ok());
  EXPECT_EQ(f.size(), 1u);
  f.Clear();
  EXPECT_FALSE(f.Resolve(5, 8).ok());
  EXPECT_EQ(f.size(), 0u);
}

}  // namespace
}  // namespace moeshard
