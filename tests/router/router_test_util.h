// Shared pieces of the router tests: a tiny tokenizer, SSE parsing, and a harness that
// runs the router library against fake coordinators on free loopback ports.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "fake_coordinator.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "router/router.h"

namespace moeshard::router::testing {

// Ids 0..255 are the bytes. Then tokens that split text in awkward places:
//   256 "xEN", 257 "D!", 258 "€", 259 "\xE2\x82" (half of "€"), 260 "\xAC!" (its end + "!").
// Added tokens: 300 <|im_start|> (special), 301 <|im_end|> (special, EOS), 302 <think>,
// 303 </think>, 304 <|endoftext|> (special).
inline constexpr int32_t kImStart = 300, kImEnd = 301, kThink = 302, kThinkEnd = 303, kEndOfText = 304;
std::unique_ptr<Tokenizer> MakeTestTokenizer();

// Token ids of the bytes of `text` (one token per byte).
std::vector<int32_t> ByteIds(const std::string& text);

struct SseStream {
  std::vector<nlohmann::json> events;  // every `data:` event but [DONE]
  bool done = false;                   // ended with data: [DONE]
  bool well_formed = true;             // every event was `data: ...\n\n`
};
SseStream ParseSse(const std::string& body);

// A plain TCP client that speaks HTTP by hand, so that it can hang up mid-stream.
class RawConnection {
 public:
  explicit RawConnection(int port);
  ~RawConnection();
  bool connected() const { return fd_ >= 0; }
  bool Send(const std::string& data);
  // Reads until `n` occurrences of `marker` arrived (or the peer closed); returns all read.
  std::string ReadUntil(const std::string& marker, int n);
  void Close();

 private:
  int Count(const std::string& marker) const;
  int fd_ = -1;
  std::string data_;
};

// A raw POST /v1/completions with stream=true for `max_tokens` tokens.
std::string StreamRequest(int max_tokens);

// A router (library, in process) in front of `num_coordinators` fake coordinators.
class RouterHarness {
 public:
  // `pools_json`: when non-empty a pools file is written with {COORD0}, {COORD1}, ...
  // replaced by the fakes' addresses; otherwise --coordinator is the first fake.
  explicit RouterHarness(int num_coordinators = 1, const std::string& pools_json = "",
                         const std::function<void(RouterConfig&)>& configure = nullptr);
  ~RouterHarness();

  FakeCoordinator& fake(int i = 0) { return *fakes_[i]; }
  Router& router() { return *router_; }
  std::unique_ptr<httplib::Client> Client() const;
  // Polls GET /ready until it answers `code` (true) or 5 s pass (false).
  bool WaitReady(int code = 200) const;
  // True once some ready coordinator in the router's /ready view satisfies `pred` (its JSON
  // object: address, ready, outstanding_tokens, queue_full, max_model_len, ...), within 10 s: a
  // test that set a fake's load or limits waits here until the router's polls have seen it.
  bool WaitCoordinatorSeen(const std::function<bool(const nlohmann::json&)>& pred) const;
  // True once /ready shows every coordinator of every pool ready (a pool turns ready with its
  // first coordinator; tests that count calls to several need all of them), within 10 s.
  bool WaitAllCoordinatorsReady() const;

 private:
  std::vector<std::unique_ptr<FakeCoordinator>> fakes_;
  std::string pools_path_;
  std::unique_ptr<Router> router_;
};

// A test with one router in front of one fake coordinator, ready, and an HTTP client.
class RouterHttpTest : public ::testing::Test {
 protected:
  void SetUp() override;
  // POSTs `body`, expects 200, returns the parsed response.
  nlohmann::json PostOk(const std::string& path, const nlohmann::json& body, const httplib::Headers& headers = {});

  std::unique_ptr<RouterHarness> h_;
  std::unique_ptr<httplib::Client> cli_;  // declared last: closed before the router stops
};

}  // namespace moeshard::router::testing
