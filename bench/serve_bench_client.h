// One request of `moeshard bench serve` against any OpenAI-compatible server (moeshard's
// router, llama.cpp's llama-server, vLLM, ...): POST /v1/completions, streamed or not, timed
// from the send to the first content chunk (TTFT) and between content chunks (inter-token
// latency), with the exact reason when it fails (HTTP status and body, a stream cut before
// [DONE], an error event, an event that is not JSON with its bytes).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/openai_client/http_client.h"

namespace moeshard::bench {

struct RequestConfig {
  std::string model;
  int64_t prompt_len = 128, output_len = 128, vocab = 256, seed = 0;
  bool stream = false, ignore_eos = true;
};

struct Timing {
  bool ok = false;
  std::string error;  // why it failed; empty when ok
  double ttft_s = 0, e2e_s = 0;
  std::vector<double> itl_s;  // per token after the first chunk: a chunk of n tokens adds n gaps of 1/n
  int64_t prompt_tokens = 0, output_tokens = 0;
  int64_t chunks = 0;  // events that carried content
  bool usage_seen = false;  // token counts came from the server's usage object
};

// The request body: `prompt_len` random token ids below `vocab` (seeded by seed and i), so
// every server sees exactly that many prompt tokens, greedy, `output_len` tokens.
openai_client::Json RequestBody(const RequestConfig& c, int64_t i);

// Sends request i and times it. Output tokens: the server's usage.completion_tokens when it
// reports one, else the token ids or non-empty text pieces the chunks carried.
Timing RunRequest(const RequestConfig& c, const openai_client::HttpClient& http, int64_t i);

// Bytes shown in an error: printable ASCII as is, others as \xNN, cut at `max` bytes.
std::string Escaped(const std::string& s, size_t max = 200);

}  // namespace moeshard::bench
