#include "bench/serve_bench.h"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <numeric>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/serve_bench_client.h"
#include "common/flags/args.h"
#include "common/openai_client/http_client.h"
#include "common/status.h"

namespace moeshard {
namespace bench {

using openai_client::Json;

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
  std::string url, api_key, json_out;
  std::vector<int64_t> concurrency = {1};
  int64_t requests = 0;  // per concurrency level; 0: 4 per stream, at least 8
  RequestConfig request;
};

struct Stats {
  double mean = 0, p50 = 0, p99 = 0;
};

Stats Summarize(const std::vector<double>& s) {
  Stats st;
  if (!s.empty()) st.mean = std::accumulate(s.begin(), s.end(), 0.0) / s.size();
  st.p50 = Percentile(s, 50);
  st.p99 = Percentile(s, 99);
  return st;
}

Json StatsJson(const Stats& s) { return {{"mean_ms", 1e3 * s.mean}, {"p50_ms", 1e3 * s.p50}, {"p99_ms", 1e3 * s.p99}}; }

void PrintRow(const char* name, const Stats& s) {
  std::printf("%-28s %10.2f %10.2f %10.2f\n", name, 1e3 * s.mean, 1e3 * s.p50, 1e3 * s.p99);
}

// One concurrency level: `requests` requests by `concurrency` clients; prints the report
// and returns it as JSON (with every distinct error and how often it happened).
Json RunLevel(const Config& cfg, const openai_client::HttpClient& http, int64_t concurrency) {
  const int64_t requests = cfg.requests > 0 ? cfg.requests : std::max<int64_t>(8, 4 * concurrency);
  const RequestConfig& rc = cfg.request;
  std::printf("moeshard bench serve: %s model %s, %ld requests, concurrency %ld, prompt %ld, output %ld tokens, %s\n",
              cfg.url.c_str(), rc.model.c_str(), requests, concurrency, rc.prompt_len, rc.output_len,
              rc.stream ? "streamed" : "not streamed");
  std::fflush(stdout);
  std::vector<Timing> timings(requests);
  std::atomic<int64_t> next{0};
  const auto t0 = Clock::now();
  std::vector<std::thread> clients;
  for (int64_t k = 0; k < concurrency; ++k) {
    clients.emplace_back([&] {
      for (int64_t i; (i = next++) < requests;) timings[i] = RunRequest(rc, http, i);
    });
  }
  for (auto& t : clients) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> ttft, itl, e2e, tpot;
  int64_t ok = 0, in_tokens = 0, out_tokens = 0;
  std::map<std::string, int64_t> errors;
  for (const Timing& t : timings) {
    if (!t.ok) {
      ++errors[t.error];
      continue;
    }
    ++ok;
    in_tokens += t.prompt_tokens;
    out_tokens += t.output_tokens;
    ttft.push_back(t.ttft_s);
    e2e.push_back(t.e2e_s);
    if (t.output_tokens > 1) tpot.push_back((t.e2e_s - t.ttft_s) / (t.output_tokens - 1));
    itl.insert(itl.end(), t.itl_s.begin(), t.itl_s.end());
  }
  const Stats s_ttft = Summarize(ttft), s_itl = Summarize(itl), s_tpot = Summarize(tpot), s_e2e = Summarize(e2e);
  std::printf("%-28s %ld\n", "successful requests:", ok);
  std::printf("%-28s %ld\n", "failed requests:", requests - ok);
  for (const auto& [e, n] : errors) std::printf("  %ld x %s\n", n, e.c_str());
  std::printf("%-28s %.2f\n", "duration (s):", duration);
  std::printf("%-28s %ld\n", "total input tokens:", in_tokens);
  std::printf("%-28s %ld\n", "total output tokens:", out_tokens);
  std::printf("%-28s %.2f\n", "request throughput (req/s):", ok / duration);
  std::printf("%-28s %.2f\n", "output throughput (tok/s):", out_tokens / duration);
  std::printf("%-28s %.2f\n", "total throughput (tok/s):", (in_tokens + out_tokens) / duration);
  std::printf("%-28s %10s %10s %10s\n", "latency (ms)", "mean", "p50", "p99");
  if (rc.stream) {
    PrintRow("TTFT", s_ttft);
    PrintRow("inter-token latency", s_itl);
    PrintRow("time per output token", s_tpot);
  } else {
    std::printf("(TTFT and inter-token latency need --stream)\n");
  }
  PrintRow("end to end", s_e2e);
  std::fflush(stdout);
  Json errs = Json::array();
  for (const auto& [e, n] : errors) errs.push_back({{"count", n}, {"error", e}});
  Json out = {{"concurrency", concurrency}, {"requests", requests}, {"successful", ok},
              {"failed", requests - ok}, {"errors", errs}, {"duration_s", duration},
              {"input_tokens", in_tokens}, {"output_tokens", out_tokens},
              {"output_tok_s", out_tokens / duration}, {"total_tok_s", (in_tokens + out_tokens) / duration},
              {"e2e", StatsJson(s_e2e)}};
  if (rc.stream) {
    out["ttft"] = StatsJson(s_ttft);
    out["itl"] = StatsJson(s_itl);
    out["tpot"] = StatsJson(s_tpot);
  }
  return out;
}

absl::Status Serve(const Config& c) {
  openai_client::HttpClient http(c.url, c.api_key, 600);
  Config cfg = c;
  if (cfg.request.model.empty()) {
    openai_client::HttpResponse r = http.Get("/v1/models");
    auto j = r.JsonBody();
    if (r.status != 200 || !j.ok() || !j->contains("data") || !(*j)["data"].is_array() || (*j)["data"].empty() ||
        !(*j)["data"][0].contains("id") || !(*j)["data"][0]["id"].is_string()) {
      return absl::UnavailableError(absl::StrCat("GET /v1/models: ", r.Describe()));
    }
    cfg.request.model = (*j)["data"][0]["id"];
  }
  Json runs = Json::array();
  int64_t failed = 0;
  for (int64_t n : cfg.concurrency) {
    runs.push_back(RunLevel(cfg, http, n));
    failed += runs.back()["failed"].get<int64_t>();
  }
  if (!cfg.json_out.empty()) {
    const RequestConfig& rc = cfg.request;
    Json doc = {{"url", cfg.url}, {"model", rc.model}, {"prompt_len", rc.prompt_len},
                {"output_len", rc.output_len}, {"stream", rc.stream}, {"ignore_eos", rc.ignore_eos}, {"runs", runs}};
    std::ofstream f(cfg.json_out, std::ios::trunc);
    f << doc.dump(2) << "\n";
    f.close();
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", cfg.json_out));
  }
  if (failed > 0) return absl::InternalError(absl::StrCat(failed, " requests failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ParseServeList(const std::string& s) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(part, &v) || v < 1 || v > 4096) {
      return absl::InvalidArgumentError(absl::StrCat("--concurrency '", s, "': a list of counts in 1..4096"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<Config> ParseConfig(const Args& a) {
  Config c;
  RequestConfig& r = c.request;
  ASSIGN_OR_RETURN(c.url, a.Required("url"));
  c.api_key = a.Get("api-key");
  c.json_out = a.Get("json");
  r.model = a.Get("model");
  r.stream = a.Flag("stream");
  const std::string eos = a.Get("ignore-eos", "true");
  if (eos != "true" && eos != "false") return absl::InvalidArgumentError("--ignore-eos is true or false");
  r.ignore_eos = eos == "true";
  ASSIGN_OR_RETURN(c.concurrency, ParseServeList(a.Get("concurrency", "1")));
  ASSIGN_OR_RETURN(c.requests, a.GetInt("requests", 0));
  ASSIGN_OR_RETURN(r.prompt_len, a.GetInt("prompt-len", 128));
  ASSIGN_OR_RETURN(r.output_len, a.GetInt("output-len", 128));
  ASSIGN_OR_RETURN(r.vocab, a.GetInt("vocab", 256));
  ASSIGN_OR_RETURN(r.seed, a.GetInt("seed", 0));
  if (c.requests < 0 || r.prompt_len < 1 || r.output_len < 1 || r.vocab < 1) {
    return absl::InvalidArgumentError("--prompt-len, --output-len and --vocab must be >= 1, --requests >= 0");
  }
  return c;
}

}  // namespace
}  // namespace bench

int BenchCommand(const std::vector<std::string>& argv) {
  const char* usage =
      "usage: moeshard bench serve --url http://HOST:PORT [--concurrency N[,N...]] [--requests M] [--prompt-len P]\n"
      "       [--output-len O] [--stream] [--ignore-eos true|false] [--api-key KEY] [--model NAME] [--vocab V]\n"
      "       [--seed S] [--json FILE]\n"
      "  any OpenAI-compatible server (POST /v1/completions); prompts are P random token ids below V\n"
      "  (default 256), so every server sees P prompt tokens; outputs O greedy tokens. Each concurrency\n"
      "  level runs M requests (default 4 per stream, at least 8); --json writes every level's figures\n";
  if (argv.empty() || argv[0] != "serve") {
    std::fprintf(stderr, "%s", usage);
    return argv.size() == 1 && (argv[0] == "--help" || argv[0] == "help") ? 0 : 2;
  }
  auto a =
      Args::Parse({argv.begin() + 1, argv.end()},
                  {"url", "concurrency", "requests", "prompt-len", "output-len", "api-key", "model", "vocab", "seed",
                   "json", "ignore-eos"},
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
