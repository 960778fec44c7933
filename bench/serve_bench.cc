#include "bench/serve_bench.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "cli/itest/http_client.h"
#include "cli/itest/openai_api.h"
#include "common/status.h"

namespace moeshard {
namespace bench {

using itest::Json;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = q / 100.0 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(rank), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - lo);
}

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  std::string url, api_key, model;
  int64_t concurrency = 1, requests = 1, prompt_len = 128, output_len = 128, vocab = 256, seed = 0;
  bool stream = false;
};

struct Timing {
  bool ok = false;
  std::string error;
  double ttft_s = 0, e2e_s = 0;
  std::vector<double> itl_s;  // gaps between token-carrying chunks after the first
  int64_t prompt_tokens = 0, output_tokens = 0;
};

Json Body(const Config& c, int64_t i) {
  return {{"model", c.model},           {"prompt", itest::MakePrompt(c.prompt_len, c.seed * 1000003 + i, c.vocab)},
          {"max_tokens", c.output_len}, {"temperature", 0},
          {"ignore_eos", true},         {"return_token_ids", true},
          {"stream", c.stream}};
}

Timing RunOne(const Config& c, const itest::HttpClient& http, int64_t i) {
  Timing t;
  Json body = Body(c, i);
  const auto t0 = Clock::now();
  auto since = [&](Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); };
  if (!c.stream) {
    itest::HttpResponse r = http.PostJson("/v1/completions", body);
    t.e2e_s = t.ttft_s = since(t0);
    auto j = r.JsonBody();
    if (r.status != 200 || !j.ok() || !j->contains("usage")) {
      t.error = r.Describe();
      return t;
    }
    t.prompt_tokens = (*j)["usage"].value("prompt_tokens", 0);
    t.output_tokens = (*j)["usage"].value("completion_tokens", 0);
    t.ok = true;
    return t;
  }
  body["stream_options"] = {{"include_usage", true}};
  Clock::time_point last;
  bool first = true, done = false;
  itest::HttpResponse r = http.PostStream("/v1/completions", body, [&](const std::string& data) {
    if (data == "[DONE]") {
      done = true;
      return true;
    }
    Json j = Json::parse(data, nullptr, false);
    if (j.is_discarded()) return false;
    if (j.contains("usage") && j["usage"].is_object()) t.prompt_tokens = j["usage"].value("prompt_tokens", 0);
    int64_t n = 0;
    for (const Json& ch : j.value("choices", Json::array())) {
      if (ch.contains("token_ids") && ch["token_ids"].is_array()) {
        n += ch["token_ids"].size();
      } else if (!ch.value("text", "").empty()) {
        n += 1;
      }
    }
    if (n == 0) return true;
    const auto now = Clock::now();
    if (first) {
      t.ttft_s = std::chrono::duration<double>(now - t0).count();
      first = false;
    } else {
      t.itl_s.push_back(std::chrono::duration<double>(now - last).count());
    }
    last = now;
    t.output_tokens += n;
    return true;
  });
  t.e2e_s = since(t0);
  if (r.status != 200 || !done || !r.error.empty()) {
    t.error = r.status != 200 ? r.Describe() : (r.error.empty() ? "stream without [DONE]" : r.error);
    return t;
  }
  t.ok = true;
  return t;
}

void PrintRow(const char* name, const std::vector<double>& s) {
  const double mean = s.empty() ? 0 : std::accumulate(s.begin(), s.end(), 0.0) / s.size();
  std::printf("%-28s %10.2f %10.2f %10.2f\n", name, 1e3 * mean, 1e3 * Percentile(s, 50), 1e3 * Percentile(s, 99));
}

absl::Status Serve(const Config& c) {
  itest::HttpClient http(c.url, c.api_key, 600);
  Config cfg = c;
  if (cfg.model.empty()) {
    itest::HttpResponse r = http.Get("/v1/models");
    auto j = r.JsonBody();
    if (r.status != 200 || !j.ok() || !(*j)["data"].is_array() || (*j)["data"].empty()) {
      return absl::UnavailableError(absl::StrCat("GET /v1/models: ", r.Describe()));
    }
    cfg.model = (*j)["data"][0]["id"];
  }
  std::printf("moeshard bench serve: %s model %s, %ld requests, concurrency %ld, prompt %ld, output %ld tokens, %s\n",
              cfg.url.c_str(), cfg.model.c_str(), cfg.requests, cfg.concurrency, cfg.prompt_len, cfg.output_len,
              cfg.stream ? "streamed" : "not streamed");
  std::fflush(stdout);
  std::vector<Timing> timings(cfg.requests);
  std::atomic<int64_t> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> clients;
  for (int64_t k = 0; k < cfg.concurrency; ++k) {
    clients.emplace_back([&] {
      for (int64_t i; (i = next++) < cfg.requests;) timings[i] = RunOne(cfg, http, i);
    });
  }
  for (auto& t : clients) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> ttft, itl, e2e;
  int64_t ok = 0, in_tokens = 0, out_tokens = 0;
  std::string first_error;
  for (const Timing& t : timings) {
    if (!t.ok) {
      if (first_error.empty()) first_error = t.error;
      continue;
    }
    ++ok;
    in_tokens += t.prompt_tokens;
    out_tokens += t.output_tokens;
    ttft.push_back(t.ttft_s);
    e2e.push_back(t.e2e_s);
    itl.insert(itl.end(), t.itl_s.begin(), t.itl_s.end());
  }
  std::printf("%-28s %ld\n", "successful requests:", ok);
  std::printf("%-28s %ld\n", "failed requests:", cfg.requests - ok);
  if (!first_error.empty()) std::printf("%-28s %s\n", "first error:", first_error.c_str());
  std::printf("%-28s %.2f\n", "duration (s):", duration);
  std::printf("%-28s %ld\n", "total input tokens:", in_tokens);
  std::printf("%-28s %ld\n", "total output tokens:", out_tokens);
  std::printf("%-28s %.2f\n", "request throughput (req/s):", ok / duration);
  std::printf("%-28s %.2f\n", "output throughput (tok/s):", out_tokens / duration);
  std::printf("%-28s %.2f\n", "total throughput (tok/s):", (in_tokens + out_tokens) / duration);
  std::printf("%-28s %10s %10s %10s\n", "latency (ms)", "mean", "p50", "p99");
  if (cfg.stream) {
    PrintRow("TTFT", ttft);
    PrintRow("inter-token latency", itl);
  } else {
    std::printf("(TTFT and inter-token latency need --stream)\n");
  }
  PrintRow("end to end", e2e);
  if (ok != cfg.requests) return absl::InternalError(absl::StrCat(cfg.requests - ok, " requests failed"));
  return absl::OkStatus();
}

absl::StatusOr<Config> ParseConfig(const Args& a) {
  Config c;
  ASSIGN_OR_RETURN(c.url, a.Required("url"));
  c.api_key = a.Get("api-key");
  c.model = a.Get("model");
  c.stream = a.Flag("stream");
  ASSIGN_OR_RETURN(c.concurrency, a.GetInt("concurrency", 1));
  ASSIGN_OR_RETURN(c.requests, a.GetInt("requests", 16));
  ASSIGN_OR_RETURN(c.prompt_len, a.GetInt("prompt-len", 128));
  ASSIGN_OR_RETURN(c.output_len, a.GetInt("output-len", 128));
  ASSIGN_OR_RETURN(c.vocab, a.GetInt("vocab", 256));
  ASSIGN_OR_RETURN(c.seed, a.GetInt("seed", 0));
  if (c.concurrency < 1 || c.requests < 1 || c.prompt_len < 1 || c.output_len < 1 || c.vocab < 1) {
    return absl::InvalidArgumentError("--concurrency, --requests, --prompt-len, --output-len and --vocab must be >= 1");
  }
  return c;
}

}  // namespace
}  // namespace bench

int BenchCommand(const std::vector<std::string>& argv) {
  const char* usage =
      "usage: moeshard bench serve --url http://HOST:PORT [--concurrency N] [--requests M] [--prompt-len P]\n"
      "       [--output-len O] [--stream] [--api-key KEY] [--model NAME] [--vocab V] [--seed S]\n"
      "  prompts are P random token ids below V (default 256); outputs O tokens (ignore_eos)\n";
  if (argv.empty() || argv[0] != "serve") {
    std::fprintf(stderr, "%s", usage);
    return argv.size() == 1 && (argv[0] == "--help" || argv[0] == "help") ? 0 : 2;
  }
  auto a =
      Args::Parse({argv.begin() + 1, argv.end()},
                  {"url", "concurrency", "requests", "prompt-len", "output-len", "api-key", "model", "vocab", "seed"},
                  {"stream", "help"});
  if (!a.ok() || a->Flag("help")) {
    std::fprintf(stderr, "%s%s\n", usage, a.ok() ? "" : std::string(a.status().message()).c_str());
    return a.ok() ? 0 : 2;
  }
  auto c = bench::ParseConfig(*a);
  if (!c.ok()) {
    std::fprintf(stderr, "moeshard bench serve: %s\n%s", std::string(c.status().message()).c_str(), usage);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  absl::Status st = bench::Serve(*c);
  if (!st.ok()) {
    std::fprintf(stderr, "moeshard bench serve: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace moeshard
