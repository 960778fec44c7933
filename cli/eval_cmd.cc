// `moeshard eval`: perplexity of a model on a text file, as llama.cpp's perplexity tool
// computes it. The text is tokenized with the model's tokenizer and cut into
// non-overlapping windows of --ctx tokens; each window runs from position 0, and the
// logits of positions ctx/2 .. ctx-2 are scored against the next token (ctx-1-ctx/2
// tokens per window). --tp N runs N tensor-parallel ranks as threads over a LocalGroup;
// --layer-split N runs N stages over contiguous layer ranges, the hidden state handed
// from stage to stage in this process.
//
// --save-logits FILE writes the scored positions' distributions in moeshard's exact MSKL
// layout or in llama.cpp's --kl-divergence-base layout (eval/kld_file.h); our windows are
// llama-perplexity's chunks (non-overlapping, n_ctx tokens, second half scored), so a file
// of either layout describes the same positions. --compare FILE reads either layout (told
// apart by its magic) as the base and reports KL(base || this run), top-1 agreement, Δp and
// both perplexities (eval/kl_stats.h); without --text it evaluates the file's own tokens, as
// llama-perplexity --kl-divergence does.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/flags/args.h"
#include "cli/commands.h"
#include "eval/kl_stats.h"
#include "eval/kld_file.h"
#include "local/chunked_forward.h"
#include "worker/runner_flags.h"
#include "common/status.h"
#include "worker/inprocess_group.h"
#include "common/model/kv_pools.h"
#include "common/model/model_loader.h"
#include "worker/model_runner.h"

namespace moeshard {
namespace {

// One window through the in-process layout (worker/inprocess_group.h), every position's
// logits; the window's blocks are the first ceil(ctx / block_size) of the pool.
class WindowRunner {
 public:
  static absl::StatusOr<WindowRunner> Create(const LoadedModel& m, int64_t ctx, RunnerOptions ro, int tp, int split) {
    WindowRunner w;
    const int64_t nb = (ctx + ro.block_size - 1) / ro.block_size;
    ro.num_kv_blocks = nb;
    // Sliding-window layers in their own pool of just their window when that is smaller.
    ro.num_sliding_kv_blocks = DefaultSlidingKvBlocks(m.config, nb, ro.block_size, 1, ro.max_batch_tokens);
    for (int32_t i = 0; i < nb; ++i) w.table_.push_back(i);
    ASSIGN_OR_RETURN(w.runner_, CreateInProcessRunner(m.config, *m.source, ro, tp, split));
    return w;
  }
  absl::Status Run(const std::vector<int32_t>& ids, std::vector<float>* logits) {
    // A window longer than --max-batch-tokens runs in chunks (chunked prefill).
    return ForwardChunked(*runner_, {SeqChunk{ids, 0, table_, true}}, logits);
  }
  std::string backend() const { return runner_->backend(); }

 private:
  std::unique_ptr<ModelRunner> runner_;
  std::vector<int32_t> table_;
};

int Fail(const std::string& msg) {
  std::fprintf(stderr, "eval: %s\n", msg.c_str());
  return 1;
}

// The tokens to evaluate: the text's cut into windows of --ctx (default: the base file's
// ctx, else 128), or without --text the base file's own windows.
struct Windows {
  std::vector<int32_t> ids;  // [num * ctx]
  int64_t ctx = 0, num = 0;
};

absl::StatusOr<Windows> ChooseWindows(const Args& a, const LoadedModel& m, const LogitsReader* base) {
  Windows w;
  ASSIGN_OR_RETURN(w.ctx, a.GetInt("ctx", base ? base->layout().ctx : 128));
  ASSIGN_OR_RETURN(const int64_t max_windows, a.GetInt("max-windows", 0));
  if (w.ctx < 4) return absl::InvalidArgumentError("--ctx must be at least 4");
  if (max_windows < 0) return absl::InvalidArgumentError("--max-windows must be >= 0");
  if (a.Has("text")) {
    std::ifstream tf(a.Get("text"), std::ios::binary);
    if (!tf) return absl::NotFoundError(absl::StrCat("cannot open --text file '", a.Get("text"), "'"));
    std::stringstream ss;
    ss << tf.rdbuf();
    if (m.tokenizer == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("model '", a.Get("model"), "' ships no tokenizer"));
    }
    auto ids = m.tokenizer->Encode(ss.str());
    if (!ids.ok()) return absl::Status(ids.status().code(), absl::StrCat("tokenizing: ", ids.status().message()));
    w.ids = std::move(*ids);
  } else {
    w.ids = base->ids();
  }
  w.num = static_cast<int64_t>(w.ids.size()) / w.ctx;
  if (w.num == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("text too short: ", w.ids.size(), " tokens, one window needs --ctx ", w.ctx));
  }
  if (max_windows > 0) w.num = std::min(w.num, max_windows);
  if (base != nullptr) {
    const LogitsLayout& bl = base->layout();
    if (bl.vocab != m.config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("vocab mismatch: --compare file has ", bl.vocab, ", model has ", m.config.vocab_size));
    }
    if (bl.ctx != w.ctx) {
      return absl::InvalidArgumentError(
          absl::StrCat("ctx mismatch: --compare file has ", bl.ctx, ", --ctx is ", w.ctx));
    }
    if (bl.num_windows < w.num) {
      std::fprintf(stderr, "eval: --compare file holds %lld windows; comparing those\n",
                   static_cast<long long>(bl.num_windows));
      w.num = bl.num_windows;
    }
    for (int64_t k = 0; k < w.num * w.ctx; ++k) {
      if (w.ids[k] != base->ids()[k]) {
        return absl::InvalidArgumentError(absl::StrCat("--compare file holds other token ids in window ", k / w.ctx,
                                                       " (another text or tokenizer?)"));
      }
    }
  }
  w.ids.resize(w.num * w.ctx);
  return w;
}

absl::Status RunEval(const Args& a) {
  ASSIGN_OR_RETURN(const int64_t tp, a.GetInt("tp", 1));
  ASSIGN_OR_RETURN(const int64_t split, a.GetInt("layer-split", 1));
  if (tp < 1 || split < 1) return absl::InvalidArgumentError("--tp and --layer-split must be >= 1");
  if (tp > 1 && split > 1) return absl::InvalidArgumentError("--tp and --layer-split cannot be combined");
  std::unique_ptr<LogitsReader> base;
  if (a.Has("compare")) {
    ASSIGN_OR_RETURN(base, LogitsReader::Open(a.Get("compare")));
  }
  ASSIGN_OR_RETURN(LoadedModel m, LoadModel(a.Get("model"), /*load_tokenizer=*/a.Has("text")));
  ASSIGN_OR_RETURN(const Windows win, ChooseWindows(a, m, base.get()));
  const int64_t N = win.ctx, V = m.config.vocab_size;
  const LogitsLayout layout{V, N, win.num};
  const int64_t first = layout.first(), S = layout.scored();

  std::unique_ptr<LogitsWriter> save;
  if (a.Has("save-logits")) {
    const std::string path = a.Get("save-logits");
    LogitsFormat format =
        path.size() > 4 && path.compare(path.size() - 4, 4, ".kld") == 0 ? LogitsFormat::kLlama : LogitsFormat::kMskl;
    if (a.Has("logits-format")) {
      ASSIGN_OR_RETURN(format, ParseLogitsFormat(a.Get("logits-format")));
    }
    ASSIGN_OR_RETURN(save, LogitsWriter::Create(path, format, layout, win.ids));
  }
  ASSIGN_OR_RETURN(RunnerOptions ro, ParseRunnerFlags(a));
  ASSIGN_OR_RETURN(auto engine, WindowRunner::Create(m, N, ro, static_cast<int>(tp), static_cast<int>(split)));
  std::fprintf(stderr, "eval: %s\n", engine.backend().c_str());

  double nll = 0;
  int64_t count = 0;
  KlStats stats;
  std::vector<float> logits, lp(S * V), blp;
  for (int64_t w = 0; w < win.num; ++w) {
    std::vector<int32_t> ids(win.ids.begin() + w * N, win.ids.begin() + (w + 1) * N);
    absl::Status st = engine.Run(ids, &logits);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("window ", w, ": ", st.message()));
    if (static_cast<int64_t>(logits.size()) != N * V) {
      return absl::InternalError("engine returned logits of the wrong size");
    }
    for (int64_t j = 0; j < S; ++j) {
      LogSoftmax(logits.data() + (first + j) * V, V, lp.data() + j * V);
      nll -= lp[j * V + ids[first + j + 1]];
    }
    if (save) RETURN_IF_ERROR(save->WriteWindow(logits.data() + first * V));
    if (base) {
      RETURN_IF_ERROR(base->ReadWindow(w, &blp));
      for (int64_t j = 0; j < S; ++j) {
        stats.Add(blp.data() + j * V, lp.data() + j * V, V, ids[first + j + 1], base->kl_floor());
      }
    }
    count += S;
    std::fprintf(stderr, "[%lld/%lld] ppl so far %.4f\n", static_cast<long long>(w + 1),
                 static_cast<long long>(win.num), std::exp(nll / count));
  }
  if (save) RETURN_IF_ERROR(save->Close());
  std::printf("perplexity: %.4f over %lld tokens\n", std::exp(nll / count), static_cast<long long>(count));
  if (base) {
    std::printf("%s", stats.Format().c_str());
    std::printf("  base file           %s (%s layout)\n", a.Get("compare").c_str(), LogitsFormatName(base->format()));
  }
  return absl::OkStatus();
}

}  // namespace

int EvalCommand(const std::vector<std::string>& argv) {
  auto a = Args::Parse(
      argv, {"model", "text", "ctx", "tp", "layer-split", "save-logits", "logits-format", "compare", "max-windows",
             "device", "gpu", "dtype", "kv-dtype", "expert-layout", "max-batch-tokens"},
      {"help"});
  if (!a.ok() || a->Flag("help") || !a->Has("model") || !(a->Has("text") || a->Has("compare"))) {
    std::fprintf(
        stderr,
        "usage: moeshard eval --model PATH (--text FILE | --compare FILE) [--ctx N] [--tp N | --layer-split N]\n"
        "                     [--save-logits FILE [--logits-format llama|mskl]] [--compare FILE] [--max-windows K]\n"
        "                     [--device cpu|cuda] [--gpu N] [--dtype bfloat16|float32] [--kv-dtype ...]\n"
        "                     [--max-batch-tokens N]  (tokens per step; a longer window runs in chunks)\n"
        "Perplexity in non-overlapping windows of --ctx tokens (default 128, or the --compare file's), each\n"
        "run from position 0 with positions ctx/2 .. ctx-2 scored: llama-perplexity's chunks, so its files\n"
        "and ours describe the same positions. Unlike llama-perplexity no BOS replaces a window's first\n"
        "token (it does so only for vocabularies that add BOS, which Qwen-style BPE ones do not), and one\n"
        "window is enough (it wants two).\n"
        "  --save-logits FILE   the scored positions' distributions; --logits-format llama writes llama.cpp's\n"
        "                       --kl-divergence-base file (log-probabilities as uint16, a scale and minimum a\n"
        "                       row), mskl moeshard's exact float32 layout; default llama for *.kld, else mskl.\n"
        "                       llama-perplexity --kl-divergence reads it with -c equal to our --ctx\n"
        "  --compare FILE       a file of either layout (told by its magic) as the base: KL(base||run) mean\n"
        "                       and max, top-1 agreement, Δp and both perplexities, as llama-perplexity\n"
        "                       --kl-divergence reports them (its files: terms of log p <= -16 left out).\n"
        "                       Without --text the file's own tokens are evaluated\n%s\n",
        a.ok() ? "" : std::string(a.status().message()).c_str());
    return (a.ok() && a->Flag("help")) ? 0 : 2;
  }
  absl::Status st = RunEval(*a);
  return st.ok() ? 0 : Fail(std::string(st.message()));
}

}  // namespace moeshard
