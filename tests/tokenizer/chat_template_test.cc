// RenderChatMl against texts rendered by Qwen3's own Jinja template (jinja2, from
// tokenizer_config.json) for the cases the goldens file does not cover.
#include "common/tokenizer/chat_template.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace moeshard {
namespace {

std::string Render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                   bool enable_thinking) {
  ChatOptions options;
  options.add_generation_prompt = add_generation_prompt;
  options.enable_thinking = enable_thinking;
  auto text = RenderChatMl(messages, options);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

TEST(ChatTemplateTest, DropsReasoningOfTurnsBeforeTheLastQuery) {
  EXPECT_EQ(Render({{"user", "Q1"}, {"assistant", "<think>\nr1\n</think>\n\nA1"}, {"user", "Q2"}},
                   true, true),
            "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, KeepsReasoningAfterTheLastQuery) {
  EXPECT_EQ(
      Render({{"user", "Q"}, {"assistant", "<think>\nreason\n</think>\n\nAnswer"}}, false, true),
      "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nreason\n</think>\n\n"
      "Answer<|im_end|>\n");
  EXPECT_EQ(Render({{"user", "Q"}, {"assistant", "pre<think>\n\nmid\n</think>x</think>\n\nend"}},
                   false, true),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nmid\n</"
            "think>\n\nend<|im_end|>\n");
}

TEST(ChatTemplateTest, GroupsToolResponses) {
  EXPECT_EQ(
      Render({{"system", "S"},
              {"user", "Q"},
              {"assistant", "call"},
              {"tool", "r1"},
              {"tool", "r2"},
              {"assistant", "\n\nDone"}},
             true, false),
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\ncall"
      "<|im_end|>\n<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n"
      "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nDone<|im_end|>\n"
      "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(
      Render(
          {{"user", "Q"}, {"assistant", "A"}, {"tool", "x"}, {"assistant", "<think>why</think>B"}},
          false, true),
      "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n<|im_start|>user\n"
      "<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nwhy\n</"
      "think>\n\n"
      "B<|im_end|>\n");
  // A user message that is a wrapped tool response is not a query.
  EXPECT_EQ(Render({{"user", "<tool_response>t</tool_response>"}, {"assistant", "no think"}}, false,
                   true),
            "<|im_start|>user\n<tool_response>t</tool_response><|im_end|>\n<|im_start|>assistant\n"
            "no think<|im_end|>\n");
}

TEST(ChatTemplateTest, RejectsBadChats) {
  const ChatOptions options;
  EXPECT_EQ(RenderChatMl({}, options).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderChatMl({{"robot", "hi"}}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderChatMl({{"", "hi"}}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderChatMl({{"user", "hi"}, {"system", "late"}}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moeshard
