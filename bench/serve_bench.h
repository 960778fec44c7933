// `moeshard bench serve`: N concurrent clients send M completion requests of a given
// prompt and output length to a running OpenAI-compatible server (a moeshard router,
// llama-server, ...) at each of several concurrency levels, and report latency percentiles
// (TTFT, inter-token latency, time per output token, end to end), throughput and why each
// failed request failed, in the manner of vLLM's benchmark_serving; --json writes the same.
// Prompts are token ids, so any model serves, tokenizer or not (see serve_bench_client.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moeshard {

// `moeshard bench serve ...` (the first argument names the benchmark).
int BenchCommand(const std::vector<std::string>& args);

namespace bench {

// The q-th percentile (0..100) of `v` with linear interpolation between ranks (numpy's
// default); 0 for an empty vector.
double Percentile(std::vector<double> v, double q);

}  // namespace bench
}  // namespace moeshard
