// `moeshard eval`: perplexity of a model on a text file, as llama.cpp's perplexity tool
// computes it. The text is tokenized with the model's tokenizer and cut into
// non-overlapping windows of --ctx tokens; each window runs from position 0, and the
// logits of positions ctx/2 .. ctx-2 are scored against the next token (ctx-1-ctx/2
// tokens per window). --tp N runs N tensor-parallel ranks as threads over LocalGroup;
// --layer-split N runs N stages over contiguous layer ranges, the hidden state handed
// from stage to stage in this process.
//
// --save-logits FILE writes the scored log-probabilities ("MSKL" format, little endian):
//   char[4]  magic "MSKL"
//   uint32   version (1)
//   uint32   vocab           V
//   uint32   ctx             N (window length)
//   uint32   num_windows     W
//   uint32   first           first scored position (N/2)
//   uint32   scored          S = rows per window (N-1-first); row j is position first+j,
//                            predicting ids[first+j+1]
//   then per window: int32 ids[N], float32 logprobs[S][V] (log-softmax over the vocabulary)
// --compare FILE reads such a file (the base) and reports KL(base || this run), mean and
// max over scored positions, top-1 agreement and both perplexities.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/comm/local_communicator.h"
#include "common/status.h"
#include "worker/kv_cache.h"
#include "worker/model_loader.h"
#include "worker/model_runner.h"

namespace moeshard {
namespace {

using WindowFn = std::function<absl::Status(const std::vector<int32_t>&, std::vector<float>*)>;

struct Engine {
  std::vector<std::unique_ptr<ModelRunner>> runners;
  std::shared_ptr<LocalGroup> group;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<int32_t> table;
  WindowFn run;
};

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const LoadedModel& m, int64_t ctx, int tp, int split) {
  const ModelConfig& c = m.config;
  auto e = std::make_unique<Engine>();
  RunnerOptions ro;
  const int64_t nb = (ctx + ro.block_size - 1) / ro.block_size;
  ro.num_kv_blocks = nb;
  for (int32_t i = 0; i < nb; ++i) e->table.push_back(i);
  Engine* ep = e.get();
  auto chunk = [ep](const std::vector<int32_t>& ids) {
    return std::vector<SeqChunk>{{ids, 0, ep->table, true}};
  };
  if (tp > 1) {
    if (c.num_kv_heads % tp || c.num_experts % tp) {
      return absl::InvalidArgumentError(absl::StrCat("--tp ", tp, " does not divide the model's ", c.num_kv_heads,
                                                     " KV heads and ", c.num_experts, " experts"));
    }
    e->group = LocalGroup::Create(tp);
    e->runners.resize(tp);
    std::vector<absl::Status> st(tp);
    std::vector<std::thread> th;
    for (int r = 0; r < tp; ++r) e->comms.push_back(e->group->Rank(r));
    for (int r = 0; r < tp; ++r) {
      th.emplace_back([&, r] {
        auto runner = ModelRunner::Create(c, *m.source, {0, c.num_layers, r, tp, true, true}, ro, ep->comms[r].get());
        if (!runner.ok()) {
          st[r] = runner.status();
          ep->comms[r]->Abort();
          return;
        }
        ep->runners[r] = std::move(*runner);
      });
    }
    for (auto& t : th) t.join();
    for (auto& s : st) RETURN_IF_ERROR(s);
    e->run = [ep, tp, chunk](const std::vector<int32_t>& ids, std::vector<float>* out) -> absl::Status {
      std::vector<std::vector<float>> outs(tp);
      std::vector<absl::Status> st(tp);
      std::vector<std::thread> th;
      for (int r = 0; r < tp; ++r) {
        th.emplace_back([&, r] {
          st[r] = ep->runners[r]->Forward(chunk(ids), &outs[r]);
          if (!st[r].ok()) ep->comms[r]->Abort();
        });
      }
      for (auto& t : th) t.join();
      for (int r = 0; r < tp; ++r) {
        if (!st[r].ok()) return absl::Status(st[r].code(), absl::StrCat("tp rank ", r, ": ", st[r].message()));
      }
      *out = std::move(outs[0]);
      return absl::OkStatus();
    };
  } else if (split > 1) {
    if (split > c.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("--layer-split ", split, " exceeds the model's ", c.num_layers, " layers"));
    }
    int64_t begin = 0;
    for (int s = 0; s < split; ++s) {
      int64_t n = c.num_layers / split + (s < c.num_layers % split ? 1 : 0);
      ShardSpec sh{begin, begin + n, 0, 1, s == 0, s == split - 1};
      ASSIGN_OR_RETURN(auto r, ModelRunner::Create(c, *m.source, sh, ro));
      e->runners.push_back(std::move(r));
      begin += n;
    }
    e->run = [ep, chunk](const std::vector<int32_t>& ids, std::vector<float>* out) -> absl::Status {
      auto b = chunk(ids);
      std::vector<float> hidden;
      RETURN_IF_ERROR(ep->runners.front()->Embed(b, &hidden));
      for (auto& r : ep->runners) RETURN_IF_ERROR(r->RunLayers(b, &hidden));
      return ep->runners.back()->Head(b, hidden, out);
    };
  } else {
    ASSIGN_OR_RETURN(auto r, ModelRunner::Create(c, *m.source, {0, c.num_layers, 0, 1, true, true}, ro));
    e->runners.push_back(std::move(r));
    e->run = [ep, chunk](const std::vector<int32_t>& ids, std::vector<float>* out) {
      return ep->runners[0]->Forward(chunk(ids), out);
    };
  }
  return e;
}

void LogSoftmax(const float* l, int64_t V, float* out) {
  double m = -INFINITY;
  for (int64_t i = 0; i < V; ++i) m = std::max<double>(m, l[i]);
  double s = 0;
  for (int64_t i = 0; i < V; ++i) s += std::exp(l[i] - m);
  const double lse = m + std::log(s);
  for (int64_t i = 0; i < V; ++i) out[i] = static_cast<float>(l[i] - lse);
}

int64_t Argmax(const float* l, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (l[i] > l[b]) b = i;
  }
  return b;
}

struct Header {
  uint32_t version = 1, vocab = 0, ctx = 0, windows = 0, first = 0, scored = 0;
};

struct Base {
  Header h;
  std::ifstream in;
};

absl::StatusOr<std::unique_ptr<Base>> OpenBase(const std::string& path) {
  auto b = std::make_unique<Base>();
  b->in.open(path, std::ios::binary);
  if (!b->in) return absl::NotFoundError(absl::StrCat("cannot open --compare file '", path, "'"));
  char magic[4];
  uint32_t f[6];
  b->in.read(magic, 4);
  b->in.read(reinterpret_cast<char*>(f), sizeof(f));
  if (!b->in || std::memcmp(magic, "MSKL", 4) != 0) return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not an MSKL logits file"));
  if (f[0] != 1) return absl::InvalidArgumentError(absl::StrCat("'", path, "': unsupported MSKL version ", f[0]));
  b->h = {f[0], f[1], f[2], f[3], f[4], f[5]};
  return b;
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "eval: %s\n", msg.c_str());
  return 1;
}

}  // namespace

int EvalCommand(const std::vector<std::string>& argv) {
  auto a = Args::Parse(argv, {"model", "text", "ctx", "tp", "layer-split", "save-logits", "compare", "max-windows"}, {"help"});
  if (!a.ok() || a->Flag("help") || !a->Has("model") || !a->Has("text")) {
    std::fprintf(stderr,
                 "usage: moeshard eval --model PATH --text FILE [--ctx N (128)] [--tp N | --layer-split N]\n"
                 "                     [--save-logits FILE] [--compare FILE] [--max-windows K]\n%s\n",
                 a.ok() ? "" : std::string(a.status().message()).c_str());
    return (a.ok() && a->Flag("help")) ? 0 : 2;
  }
  auto ctx = a->GetInt("ctx", 128), tp = a->GetInt("tp", 1), split = a->GetInt("layer-split", 1),
       maxw = a->GetInt("max-windows", 0);
  for (auto* s : {&ctx, &tp, &split, &maxw}) {
    if (!s->ok()) return Fail(std::string(s->status().message()));
  }
  if (*ctx < 4) return Fail("--ctx must be at least 4");
  if (*tp < 1 || *split < 1 || *maxw < 0) return Fail("--tp, --layer-split must be >= 1 and --max-windows >= 0");
  if (*tp > 1 && *split > 1) return Fail("--tp and --layer-split cannot be combined");

  std::ifstream tf(a->Get("text"), std::ios::binary);
  if (!tf) return Fail(absl::StrCat("cannot open --text file '", a->Get("text"), "'"));
  std::stringstream ss;
  ss << tf.rdbuf();

  auto m = LoadModel(a->Get("model"), /*load_tokenizer=*/true);
  if (!m.ok()) return Fail(std::string(m.status().message()));
  if (m->tokenizer == nullptr) return Fail(absl::StrCat("model '", a->Get("model"), "' ships no tokenizer"));
  auto ids = m->tokenizer->Encode(ss.str());
  if (!ids.ok()) return Fail(absl::StrCat("tokenizing: ", ids.status().message()));
  const int64_t N = *ctx, V = m->config.vocab_size;
  int64_t W = static_cast<int64_t>(ids->size()) / N;
  if (W == 0) {
    return Fail(absl::StrCat("text too short: ", ids->size(), " tokens, one window needs --ctx ", N));
  }
  if (*maxw > 0) W = std::min(W, *maxw);
  const int64_t first = N / 2, S = N - 1 - first;

  std::unique_ptr<Base> base;
  if (a->Has("compare")) {
    auto b = OpenBase(a->Get("compare"));
    if (!b.ok()) return Fail(std::string(b.status().message()));
    base = std::move(*b);
    if (base->h.vocab != V) return Fail(absl::StrCat("vocab mismatch: --compare file has ", base->h.vocab, ", model has ", V));
    if (base->h.ctx != N) return Fail(absl::StrCat("ctx mismatch: --compare file has ", base->h.ctx, ", --ctx is ", N));
    if (base->h.first != first || base->h.scored != S) return Fail("--compare file scores other positions");
    if (base->h.windows < W) {
      std::fprintf(stderr, "eval: --compare file holds %u windows; comparing those\n", base->h.windows);
      W = base->h.windows;
    }
  }
  std::ofstream save;
  if (a->Has("save-logits")) {
    save.open(a->Get("save-logits"), std::ios::binary | std::ios::trunc);
    if (!save) return Fail(absl::StrCat("cannot write --save-logits file '", a->Get("save-logits"), "'"));
    uint32_t f[6] = {1, static_cast<uint32_t>(V), static_cast<uint32_t>(N), static_cast<uint32_t>(W),
                     static_cast<uint32_t>(first), static_cast<uint32_t>(S)};
    save.write("MSKL", 4);
    save.write(reinterpret_cast<const char*>(f), sizeof(f));
  }

  auto engine = MakeEngine(*m, N, static_cast<int>(*tp), static_cast<int>(*split));
  if (!engine.ok()) return Fail(std::string(engine.status().message()));

  double nll = 0, base_nll = 0, kl_sum = 0, kl_max = 0;
  int64_t count = 0, agree = 0;
  std::vector<float> logits, lp(S * V), blp(S * V);
  std::vector<int32_t> bids(N);
  for (int64_t w = 0; w < W; ++w) {
    std::vector<int32_t> win(ids->begin() + w * N, ids->begin() + (w + 1) * N);
    absl::Status st = (*engine)->run(win, &logits);
    if (!st.ok()) return Fail(absl::StrCat("window ", w, ": ", st.message()));
    if (static_cast<int64_t>(logits.size()) != N * V) return Fail("engine returned logits of the wrong size");
    for (int64_t j = 0; j < S; ++j) {
      LogSoftmax(logits.data() + (first + j) * V, V, lp.data() + j * V);
      nll -= lp[j * V + win[first + j + 1]];
    }
    if (save.is_open()) {
      save.write(reinterpret_cast<const char*>(win.data()), N * sizeof(int32_t));
      save.write(reinterpret_cast<const char*>(lp.data()), S * V * sizeof(float));
    }
    if (base) {
      base->in.read(reinterpret_cast<char*>(bids.data()), N * sizeof(int32_t));
      base->in.read(reinterpret_cast<char*>(blp.data()), S * V * sizeof(float));
      if (!base->in) return Fail(absl::StrCat("--compare file is truncated at window ", w));
      if (bids != win) return Fail(absl::StrCat("--compare file holds other token ids in window ", w, " (another text or tokenizer?)"));
      for (int64_t j = 0; j < S; ++j) {
        const float* p = blp.data() + j * V;
        const float* q = lp.data() + j * V;
        double kl = 0;
        for (int64_t i = 0; i < V; ++i) kl += std::exp(static_cast<double>(p[i])) * (p[i] - q[i]);
        kl_sum += kl;
        kl_max = std::max(kl_max, kl);
        agree += Argmax(p, V) == Argmax(q, V);
        base_nll -= p[win[first + j + 1]];
      }
    }
    count += S;
    std::fprintf(stderr, "[%lld/%lld] ppl so far %.4f\n", static_cast<long long>(w + 1), static_cast<long long>(W),
                 std::exp(nll / count));
  }
  if (save.is_open()) {
    save.close();
    if (!save) return Fail(absl::StrCat("writing --save-logits file '", a->Get("save-logits"), "' failed"));
  }
  std::printf("perplexity: %.4f over %lld tokens\n", std::exp(nll / count), static_cast<long long>(count));
  if (base) {
    std::printf("compare: base perplexity %.4f, this run %.4f; KL(base||run) mean %.3g max %.3g; top-1 agreement %.2f %%\n",
                std::exp(base_nll / count), std::exp(nll / count), kl_sum / count, kl_max, 100.0 * agree / count);
  }
  return 0;
}

}  // namespace moeshard
