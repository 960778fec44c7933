// `moeshard bench serve`: N concurrent clients send M completion requests of a given
// prompt and output length to a running router and report latency percentiles (TTFT,
// inter-token latency, end to end) and throughput, in the manner of vLLM's
// benchmark_serving. Prompts are token ids, so any model serves, tokenizer or not.
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
