// sampler_bench: time per sampled token of Sampler::Sample against the full-sort definition
// (SampleByFullSort) in the same run, on one row of a 151,936-token vocabulary (Qwen3's),
// for greedy, temperature, top-p, min-p and top-k settings, and checks both pick the same
// tokens. Usage: sampler_bench [--vocab N] [--scale S] [--tokens N]
//   --scale: standard deviation of the random logits (larger: a more peaked distribution).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "worker/sampler.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double MsPerToken(int n, F&& f) {
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) f(i);
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / n;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace moeshard;
  int64_t vocab = 151936;
  float scale = 3.f;
  int tokens = 40;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--vocab")) vocab = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--scale")) scale = std::strtof(argv[i + 1], nullptr);
    else if (!std::strcmp(argv[i], "--tokens")) tokens = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: sampler_bench [--vocab N] [--scale S] [--tokens N]\n");
      return 2;
    }
  }
  if (vocab < 1 || tokens < 1 || !(scale > 0)) {
    std::fprintf(stderr, "sampler_bench: --vocab and --tokens must be >= 1, --scale > 0\n");
    return 2;
  }
  std::mt19937 gen(1);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> logits(vocab);
  for (auto& x : logits) x = nd(gen);
  struct Case {
    const char* name;
    float temperature, top_p, min_p;
    int top_k;
  };
  const Case cases[] = {{"greedy", 0.f, 1.f, 0.f, 0},         {"temperature 0.7", 0.7f, 1.f, 0.f, 0},
                        {"temperature 1.0", 1.f, 1.f, 0.f, 0}, {"t 0.7, top-p 0.9", 0.7f, 0.9f, 0.f, 0},
                        {"t 1.0, top-p 0.95", 1.f, 0.95f, 0.f, 0}, {"t 0.7, min-p 0.05", 0.7f, 1.f, 0.05f, 0},
                        {"t 0.7, top-k 50", 0.7f, 1.f, 0.f, 50}};
  std::printf("vocab %lld, logits ~ N(0, %.1f), %d tokens per setting\n", static_cast<long long>(vocab), scale, tokens);
  std::printf("| setting | Sampler ms/token | full sort ms/token | speed-up | same tokens |\n|---|---|---|---|---|\n");
  int bad = 0;
  for (const Case& c : cases) {
    SamplingParams p;
    p.temperature = c.temperature;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.top_k = c.top_k;
    p.seed = 7;
    p.has_seed = true;
    Sampler s(p);
    std::vector<int32_t> a(tokens), b(tokens);
    const double fast = MsPerToken(tokens, [&](int i) { a[i] = s.Sample(logits.data(), vocab, i); });
    const double full = MsPerToken(tokens, [&](int i) { b[i] = SampleByFullSort(logits.data(), vocab, p, i); });
    const bool same = a == b;
    bad += !same;
    std::printf("| %s | %.3f | %.3f | %.1fx | %s |\n", c.name, fast, full, full / fast, same ? "yes" : "NO");
  }
  // What a request with logprobs and top_logprobs 20 adds per token: LogProb + TopLogProbs against
  // the plain definition (std::exp summed in id order, a partial sort of every id).
  std::vector<std::pair<int32_t, float>> top, want;
  SamplerSet set;
  RowDraw draw;
  draw.sampling.temperature = 0.f;
  draw.logprobs = true;
  draw.top_logprobs = 20;
  RowDraw plain_draw = draw;  // the same greedy draw without logprobs, subtracted below
  plain_draw.logprobs = false;
  plain_draw.top_logprobs = 0;
  const double greedy_only = MsPerToken(tokens, [&](int) { (void)set.Sample({plain_draw}, logits.data(), vocab); });
  const double lp = MsPerToken(tokens, [&](int) { top = set.Sample({draw}, logits.data(), vocab)[0].top; }) - greedy_only;
  const double plain = MsPerToken(tokens, [&](int i) {
    double m = logits[0], sum = 0;
    for (float x : logits) m = std::max<double>(m, x);
    for (float x : logits) sum += std::exp(x - m);
    volatile float x = static_cast<float>(logits[i] - (m + std::log(sum)));
    (void)x;
    std::vector<int32_t> idx(vocab);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + 20, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    want.clear();
    for (int k = 0; k < 20; ++k) want.push_back({idx[k], static_cast<float>(logits[idx[k]] - (m + std::log(sum)))});
  });
  bool same = top.size() == want.size();
  for (size_t k = 0; same && k < top.size(); ++k) same = top[k].first == want[k].first && std::abs(top[k].second - want[k].second) < 1e-5f;
  bad += !same;
  std::printf("| logprob + top 20 logprobs | %.3f | %.3f (plain) | %.1fx | %s |\n", lp, plain, plain / lp, same ? "yes" : "NO");
  return bad ? 1 : 0;
}
