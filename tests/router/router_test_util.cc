#include "router_test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/tokenizer/byte_level.h"
#include "gtest/gtest.h"

namespace moeshard::router::testing {

std::unique_ptr<Tokenizer> MakeTestTokenizer() {
  auto spell = [](const std::string& bytes) {
    std::string out;
    tokenizer_internal::AppendByteLevel(bytes, &out);
    return out;
  };
  TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) spec.vocab.push_back(spell(std::string(1, static_cast<char>(b))));
  for (const char* t : {"xEN", "D!", "\xE2\x82\xAC", "\xE2\x82", "\xAC!"}) spec.vocab.push_back(spell(t));
  spec.added = {{.id = kImStart, .content = "<|im_start|>", .special = true},
                {.id = kImEnd, .content = "<|im_end|>", .special = true},
                {.id = kThink, .content = "<think>"},
                {.id = kThinkEnd, .content = "</think>"},
                {.id = kEndOfText, .content = "<|endoftext|>", .special = true}};
  spec.eos_id = kImEnd;
  auto tok = Tokenizer::Create(std::move(spec));
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? *std::move(tok) : nullptr;
}

std::vector<int32_t> ByteIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

SseStream ParseSse(const std::string& body) {
  SseStream s;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos || body.compare(pos, 6, "data: ") != 0) {
      s.well_formed = false;
      break;
    }
    const std::string data = body.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    if (data == "[DONE]") {
      s.done = true;
      if (pos != body.size()) s.well_formed = false;  // nothing may follow [DONE]
      break;
    }
    s.events.push_back(nlohmann::json::parse(data, nullptr, false));
    if (s.events.back().is_discarded()) s.well_formed = false;
  }
  return s;
}

RawConnection::RawConnection(int port) {
  fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Close();
}

RawConnection::~RawConnection() { Close(); }

bool RawConnection::Send(const std::string& data) {
  return fd_ >= 0 && write(fd_, data.data(), data.size()) == static_cast<ssize_t>(data.size());
}

std::string RawConnection::ReadUntil(const std::string& marker, int n) {
  while (fd_ >= 0 && Count(marker) < n) {
    char buf[4096];
    const ssize_t got = read(fd_, buf, sizeof(buf));
    if (got <= 0) break;
    data_.append(buf, static_cast<size_t>(got));
  }
  return data_;
}

void RawConnection::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

int RawConnection::Count(const std::string& marker) const {
  int n = 0;
  for (size_t pos = data_.find(marker); pos != std::string::npos; pos = data_.find(marker, pos + 1)) ++n;
  return n;
}

std::string StreamRequest(int max_tokens) {
  const std::string body = nlohmann::json{{"prompt", "abcdefgh"}, {"max_tokens", max_tokens}, {"stream", true}}.dump();
  return absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n",
                      "Content-Length: ", body.size(), "\r\n\r\n", body);
}

RouterHarness::RouterHarness(int num_coordinators, const std::string& pools_json,
                             const std::function<void(RouterConfig&)>& configure) {
  std::vector<std::string> addresses;
  for (int i = 0; i < num_coordinators; ++i) {
    fakes_.push_back(std::make_unique<FakeCoordinator>());
    addresses.push_back(fakes_.back()->Start());
  }
  RouterConfig config;
  config.poll_interval = absl::Milliseconds(20);
  config.drain_timeout = absl::Seconds(2);
  config.heal_wait = absl::Milliseconds(200);  // tests of a coordinator that stays down answer soon
  config.http_threads = 16;
  config.served_model_name = "test-model";
  if (pools_json.empty()) {
    config.coordinator = addresses[0];
  } else {
    std::string text = pools_json;
    for (int i = 0; i < num_coordinators; ++i)
      text = absl::StrReplaceAll(text, {{absl::StrCat("{COORD", i, "}"), addresses[i]}});
    pools_path_ = absl::StrCat(::testing::TempDir(), "/router_pools_", reinterpret_cast<uintptr_t>(this), ".json");
    std::ofstream(pools_path_) << text;
    config.pools_path = pools_path_;
  }
  if (configure) configure(config);
  auto router = Router::Create(config, MakeTestTokenizer(), {kImEnd});
  EXPECT_TRUE(router.ok()) << router.status();
  if (!router.ok()) return;
  router_ = *std::move(router);
  absl::Status st = router_->Start();
  EXPECT_TRUE(st.ok()) << st;
}

RouterHarness::~RouterHarness() {
  if (router_) router_->Shutdown();
  router_.reset();
  for (auto& f : fakes_) f->Stop();
  if (!pools_path_.empty()) std::remove(pools_path_.c_str());
}

std::unique_ptr<httplib::Client> RouterHarness::Client() const {
  auto cli = std::make_unique<httplib::Client>("127.0.0.1", router_->http_port());
  cli->set_read_timeout(20, 0);
  cli->set_keep_alive(true);  // one connection: each response is fully logged before the next request
  return cli;
}

bool RouterHarness::WaitReady(int code) const {
  auto cli = Client();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    auto res = cli->Get("/ready");
    if (res && res->status == code) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

bool RouterHarness::WaitCoordinatorSeen(const std::function<bool(const nlohmann::json&)>& pred) const {
  auto cli = Client();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    auto res = cli->Get("/ready");
    const nlohmann::json j = res ? nlohmann::json::parse(res->body, nullptr, false) : nlohmann::json();
    for (const auto& p : j.is_object() ? j.value("pools", nlohmann::json::array()) : nlohmann::json::array()) {
      for (const auto& c : p.value("coordinators", nlohmann::json::array())) {
        if (c.value("ready", false) && pred(c)) return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

bool RouterHarness::WaitAllCoordinatorsReady() const {
  auto cli = Client();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    auto res = cli->Get("/ready");
    if (res && res->status == 200) {
      const nlohmann::json j = nlohmann::json::parse(res->body, nullptr, false);
      bool all = j.is_object() && j.contains("pools") && !j["pools"].empty();
      for (const auto& p : all ? j["pools"] : nlohmann::json::array()) {
        for (const auto& c : p.value("coordinators", nlohmann::json::array())) all = all && c.value("ready", false);
      }
      if (all) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void RouterHttpTest::SetUp() {
  h_ = std::make_unique<RouterHarness>();
  ASSERT_TRUE(h_->WaitReady()) << "the router never became ready";
  cli_ = h_->Client();
}

nlohmann::json RouterHttpTest::PostOk(const std::string& path, const nlohmann::json& body,
                                      const httplib::Headers& headers) {
  auto res = cli_->Post(path.c_str(), headers, body.dump(), "application/json");
  EXPECT_TRUE(res) << "no response";
  if (!res) return nlohmann::json();
  EXPECT_EQ(res->status, 200) << res->body;
  return nlohmann::json::parse(res->body, nullptr, false);
}

}  // namespace moeshard::router::testing
