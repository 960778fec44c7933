#include "eval/golden_check.h"

#include "common/model/kv_pools.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "eval/kl_stats.h"
#include "common/formats/safetensors.h"
#include "common/status.h"
#include "local/chunked_forward.h"
#include "local/local_engine.h"
#include "worker/inprocess_group.h"
#include "worker/kv_cache.h"
#include "worker/model_runner.h"

namespace moeshard {
namespace {

struct Golden {
  std::vector<int32_t> ids;
  std::vector<float> logits;  // [T, V] or empty
  std::vector<int32_t> topk_ids;
  std::vector<float> topk_logits, lse;
  int64_t topk = 0;
};

template <typename T>
absl::StatusOr<std::vector<T>> Read(const SafetensorsCheckpoint& g, const std::string& name, DType want) {
  const TensorInfo* t = g.Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("goldens: '", name, "' is missing"));
  if (t->dtype != want) return absl::InvalidArgumentError(absl::StrCat("goldens: '", name, "' has dtype ", DTypeName(t->dtype)));
  std::vector<T> v(t->numel());
  if (t->nbytes != v.size() * sizeof(T)) return absl::InvalidArgumentError(absl::StrCat("goldens: '", name, "' size mismatch"));
  std::memcpy(v.data(), t->data, t->nbytes);
  return v;
}

constexpr double kQ8Lse = 0.1, kQ8Topk = 0.3;

// bf16 with top-k goldens: every lse within bf16_max_lse, or all but bf16_outliers of the positions.
bool Bf16LseOk(const CheckLimits& lim, double max_lse_err, int64_t over, int64_t positions) {
  return max_lse_err <= lim.bf16_max_lse || over <= static_cast<int64_t>(lim.bf16_outliers * positions);
}

SeqReport Compare(const std::string& name, const Golden& g, const std::vector<float>& got, int64_t V,
                  const CheckLimits& lim) {
  const Tolerance tol = lim.kind;
  SeqReport r;
  r.name = name;
  const int64_t T = g.ids.size();
  r.positions = T;
  int64_t agree = 0, bad_positions = 0;
  bool ok = true;
  double worst = -1;
  for (int64_t t = 0; t < T; ++t) {
    const float* l = got.data() + t * V;
    double lse = LogSumExp(l, V);
    double err = 0, lse_err = 0;  // this position's
    if (!g.logits.empty()) {
      const float* gl = g.logits.data() + t * V;
      double glse = LogSumExp(gl, V), kl = 0;
      for (int64_t i = 0; i < V; ++i) {
        err = std::max(err, std::fabs(l[i] - gl[i]) / std::max(1.0, std::fabs(static_cast<double>(gl[i]))));
        double lp = gl[i] - glse, lq = l[i] - lse;
        kl += std::exp(lp) * (lp - lq);
      }
      r.mean_kl += kl / T;
      r.max_kl = std::max(r.max_kl, kl);
      lse_err = std::fabs(lse - glse);
      agree += Argmax(l, V) == Argmax(gl, V);
    } else {
      for (int64_t j = 0; j < g.topk; ++j) {
        int32_t id = g.topk_ids[t * g.topk + j];
        double gv = g.topk_logits[t * g.topk + j];
        double e = std::fabs(l[id] - gv);
        if (tol == Tolerance::kFp32) e /= std::max(1.0, std::fabs(gv));
        err = std::max(err, e);
      }
      lse_err = std::fabs(lse - g.lse[t]);
      if (tol == Tolerance::kFp32) lse_err /= std::max(1.0, std::fabs(static_cast<double>(g.lse[t])));
      r.over_bf16_lse += lse_err > lim.bf16_max_lse;
      bad_positions += (lse_err > kQ8Lse || err > kQ8Topk);
      agree += Argmax(l, V) == g.topk_ids[t * g.topk];
    }
    r.max_err = std::max(r.max_err, err);
    r.max_lse_err = std::max(r.max_lse_err, lse_err);
    if (std::max(err, lse_err) > worst) worst = std::max(err, lse_err), r.worst_position = t;
    r.positions_over += std::max(err, lse_err) > 1e-3;
  }
  r.top1 = T ? static_cast<double>(agree) / T : 1.0;
  switch (tol) {
    case Tolerance::kFp32:
      ok = (r.max_err <= 1e-3 && r.max_lse_err <= 1e-3) ||
           (r.positions_over <= static_cast<int64_t>(lim.fp32_outliers * T) && r.max_lse_err <= kFp32OutlierLse &&
            r.top1 >= 0.999);
      break;
    // Q8_0: top-1 >= 95 %; lse within 0.1 and top-20 logits within 0.3 at every position but at
    // most 1 % of them (at least one): on this random MoE a 0.3 % weight perturbation can flip
    // a routing decision at a near-tie, which moves that one position's logits (measured: seq2
    // position 44 of qwen3moe-tok, every other position within 0.025).
    case Tolerance::kQ8_0:
      ok = r.top1 >= 0.95 && bad_positions <= std::max<int64_t>(1, T / 100);
      break;
    case Tolerance::kBf16:
      ok = g.logits.empty() ? (r.top1 >= lim.bf16_topk_top1 && Bf16LseOk(lim, r.max_lse_err, r.over_bf16_lse, T))
                            : (r.top1 >= lim.bf16_top1 && r.mean_kl <= lim.bf16_mean_kl);
      break;
  }
  r.pass = ok;
  r.full_logits = !g.logits.empty();
  r.gating = tol != Tolerance::kBf16;
  return r;
}

absl::StatusOr<std::vector<Golden>> ReadSeqs(const SafetensorsCheckpoint& gf, int64_t V) {
  std::vector<Golden> out;
  for (int k = 0;; ++k) {
    std::string p = absl::StrCat("seq", k, ".");
    if (gf.Find(p + "ids") == nullptr) break;
    Golden g;
    ASSIGN_OR_RETURN(g.ids, Read<int32_t>(gf, p + "ids", DType::kI32));
    if (g.ids.empty()) return absl::InvalidArgumentError(absl::StrCat("goldens: ", p, "ids is empty"));
    for (int32_t id : g.ids) {
      if (id < 0 || id >= V) return absl::InvalidArgumentError(absl::StrCat("goldens: ", p, "ids holds ", id, ", outside the vocabulary"));
    }
    const int64_t T = g.ids.size();
    if (gf.Find(p + "logits") != nullptr) {
      ASSIGN_OR_RETURN(g.logits, Read<float>(gf, p + "logits", DType::kF32));
      if (static_cast<int64_t>(g.logits.size()) != T * V) {
        return absl::InvalidArgumentError(absl::StrCat("goldens: ", p, "logits is not [", T, ", ", V, "]"));
      }
    } else {
      ASSIGN_OR_RETURN(g.topk_ids, Read<int32_t>(gf, p + "topk_ids", DType::kI32));
      ASSIGN_OR_RETURN(g.topk_logits, Read<float>(gf, p + "topk_logits", DType::kF32));
      ASSIGN_OR_RETURN(g.lse, Read<float>(gf, p + "lse", DType::kF32));
      g.topk = g.topk_ids.size() / T;
      if (g.topk == 0 || static_cast<int64_t>(g.topk_ids.size()) != T * g.topk || g.topk_logits.size() != g.topk_ids.size() ||
          static_cast<int64_t>(g.lse.size()) != T) {
        return absl::InvalidArgumentError(absl::StrCat("goldens: ", p, "top-k tensors have inconsistent shapes"));
      }
      for (int32_t id : g.topk_ids) {
        if (id < 0 || id >= V) return absl::InvalidArgumentError(absl::StrCat("goldens: ", p, "topk_ids holds ", id));
      }
    }
    out.push_back(std::move(g));
  }
  if (out.empty()) return absl::InvalidArgumentError("goldens: no seq0.ids");
  return out;
}

// Greedy continuations must be identical on the fp32 and Q8_0 paths. On the bf16 path a
// rounding difference may legitimately change a later token (README: random MoE models are
// chaotic), so there the sequences' KL and top-1 gate and the match is reported only.
absl::Status RunGens(const SafetensorsCheckpoint& gf, const GreedyFn& greedy, Tolerance tol, CheckReport& rep) {
  for (int k = 0;; ++k) {
    std::string p = absl::StrCat("gen", k, ".");
    if (gf.Find(p + "prompt") == nullptr) break;
    GenReport gr;
    gr.name = absl::StrCat("gen", k);
    ASSIGN_OR_RETURN(auto prompt, Read<int32_t>(gf, p + "prompt", DType::kI32));
    ASSIGN_OR_RETURN(gr.expected, Read<int32_t>(gf, p + "greedy", DType::kI32));
    ASSIGN_OR_RETURN(gr.got, greedy(prompt, gr.expected.size()));
    gr.pass = gr.got == gr.expected;
    gr.gating = tol != Tolerance::kBf16;
    rep.gens.push_back(std::move(gr));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Tolerance> ParseTolerance(const std::string& s) {
  if (s == "fp32") return Tolerance::kFp32;
  if (s == "q8_0") return Tolerance::kQ8_0;
  if (s == "bf16") return Tolerance::kBf16;
  return absl::InvalidArgumentError(absl::StrCat("unknown tolerance '", s, "' (fp32, q8_0, bf16)"));
}

absl::StatusOr<CheckLayout::Runs> ParseRuns(const std::string& list) {
  CheckLayout::Runs r{false, false, false};
  for (absl::string_view run : absl::StrSplit(list, ',')) {
    bool* on = run == "whole" ? &r.whole : run == "batched" ? &r.batched : run == "decode" ? &r.decode : nullptr;
    if (on == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown run '", run, "' (whole, batched, decode)"));
    *on = true;
  }
  return r;
}

bool CheckReport::pass() const {
  if (seqs.empty()) return false;
  for (auto& s : seqs) {
    if (s.gating && !s.pass) return false;
  }
  for (auto& p : pooled) {
    if (!p.pass) return false;
  }
  for (auto& g : gens) {
    if (g.gating && !g.pass) return false;
  }
  return true;
}

std::string CheckReport::Format() const {
  std::string out;
  for (auto& s : seqs) {
    absl::StrAppend(&out, absl::StrFormat("%-18s T=%-4d max_err=%.3g lse_err=%.3g top1=%.1f%%", s.name, s.positions,
                                          s.max_err, s.max_lse_err, 100 * s.top1));
    if (s.positions_over > 0) absl::StrAppend(&out, absl::StrFormat(" worst@%d over1e-3=%d", s.worst_position, s.positions_over));
    if (s.over_bf16_lse > 0) absl::StrAppend(&out, absl::StrFormat(" over_bf16_lse=%d", s.over_bf16_lse));
    if (s.mean_kl > 0 || s.max_kl > 0) absl::StrAppend(&out, absl::StrFormat(" kl_mean=%.3g kl_max=%.3g", s.mean_kl, s.max_kl));
    absl::StrAppend(&out, s.pass ? "  ok\n" : s.gating ? "  FAIL\n" : "  (pooled below)\n");
  }
  for (auto& p : pooled) {
    absl::StrAppend(&out, absl::StrFormat("pooled %-11s T=%-4d top1=%.1f%%", p.name, p.positions, 100 * p.top1));
    if (p.full_logits) {
      absl::StrAppend(&out, absl::StrFormat(" kl_mean=%.3g", p.mean_kl));
    } else {
      absl::StrAppend(&out, absl::StrFormat(" lse_err=%.3g", p.max_lse_err));
      if (p.over_bf16_lse > 0) absl::StrAppend(&out, absl::StrFormat(" over_bf16_lse=%d", p.over_bf16_lse));
    }
    absl::StrAppend(&out, p.pass ? "  ok\n" : "  FAIL\n");
  }
  for (auto& g : gens) {
    int64_t match = 0;
    while (match < static_cast<int64_t>(std::min(g.got.size(), g.expected.size())) && g.got[match] == g.expected[match]) ++match;
    absl::StrAppend(&out, absl::StrFormat("%-18s greedy %d/%d tokens match%s\n", g.name, match, g.expected.size(),
                                          g.pass ? "  ok" : g.gating ? "  FAIL" : "  (reported only on the bf16 path)"));
    if (!g.pass) absl::StrAppend(&out, "  expected ", absl::StrJoin(g.expected, " "), "\n  got      ", absl::StrJoin(g.got, " "), "\n");
  }
  absl::StrAppend(&out, pass() ? "PASS\n" : "FAIL\n");
  return out;
}

// Pools the sequences of each way of running them (the suffix of "seq<k> <how>").
void Pool(const CheckLimits& lim, CheckReport& rep) {
  if (lim.kind != Tolerance::kBf16) return;
  std::vector<std::string> order;
  std::map<std::string, PooledReport> by;
  for (const SeqReport& r : rep.seqs) {
    const size_t sp = r.name.find(' ');
    const std::string how = sp == std::string::npos ? "all" : r.name.substr(sp + 1);
    if (!by.count(how)) order.push_back(how);
    PooledReport& p = by[how];
    p.name = how;
    p.full_logits = r.full_logits;
    p.mean_kl += r.mean_kl * r.positions;
    p.top1 += r.top1 * r.positions;
    p.max_lse_err = std::max(p.max_lse_err, r.max_lse_err);
    p.over_bf16_lse += r.over_bf16_lse;
    p.positions += r.positions;
  }
  for (const std::string& how : order) {
    PooledReport p = by[how];
    p.mean_kl /= std::max<int64_t>(1, p.positions);
    p.top1 /= std::max<int64_t>(1, p.positions);
    p.pass = p.full_logits ? (p.top1 >= lim.bf16_top1 && p.mean_kl <= lim.bf16_mean_kl)
                           : (p.top1 >= lim.bf16_topk_top1 && Bf16LseOk(lim, p.max_lse_err, p.over_bf16_lse, p.positions));
    rep.pooled.push_back(p);
  }
}

absl::StatusOr<CheckReport> CheckWith(const LogitsFn& logits, const GreedyFn& greedy, int64_t V,
                                      const std::string& goldens_path, const CheckLimits& tol) {
  ASSIGN_OR_RETURN(auto gf, SafetensorsCheckpoint::OpenFile(goldens_path));
  ASSIGN_OR_RETURN(auto seqs, ReadSeqs(*gf, V));
  CheckReport rep;
  for (size_t k = 0; k < seqs.size(); ++k) {
    ASSIGN_OR_RETURN(auto l, logits(seqs[k].ids));
    if (static_cast<int64_t>(l.size()) != static_cast<int64_t>(seqs[k].ids.size()) * V) {
      return absl::InternalError("engine returned logits of the wrong size");
    }
    rep.seqs.push_back(Compare(absl::StrCat("seq", k), seqs[k], l, V, tol));
  }
  RETURN_IF_ERROR(RunGens(*gf, greedy, tol.kind, rep));
  Pool(tol, rep);
  return rep;
}

absl::StatusOr<CheckReport> CheckModel(const LoadedModel& model, const std::string& goldens_path,
                                       const CheckLimits& tol, const CheckLayout& layout) {
  const ModelConfig& c = model.config;
  const int64_t V = c.vocab_size;
  ASSIGN_OR_RETURN(auto gf, SafetensorsCheckpoint::OpenFile(goldens_path));
  ASSIGN_OR_RETURN(auto seqs, ReadSeqs(*gf, V));
  RunnerOptions ro = layout.runner;
  int64_t total = 64;
  for (auto& s : seqs) total += s.ids.size();
  ro.num_kv_blocks = total / ro.block_size + 2 * static_cast<int64_t>(seqs.size()) + 8;
  // A model with both layer kinds keeps its sliding-window layers' KV in their own, smaller pool
  // when that saves memory (long goldens), as a coordinator does (common/model/kv_pools.h).
  ro.num_sliding_kv_blocks = DefaultSlidingKvBlocks(c, ro.num_kv_blocks, ro.block_size,
                                                    static_cast<int64_t>(seqs.size()) + 1, ro.max_batch_tokens);
  ASSIGN_OR_RETURN(auto runner, CreateInProcessRunner(c, *model.source, ro, layout.tp, layout.stages));
  BlockAllocator blocks(ro.num_kv_blocks);
  CheckReport rep;
  rep.backend = runner->backend();
  auto run = [&](std::vector<SeqChunk> batch, std::vector<float>* out) -> absl::Status {
    std::vector<std::vector<int32_t>> tables(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      RETURN_IF_ERROR(blocks.Reserve(tables[i], batch[i].start_pos + batch[i].tokens.size(), ro.block_size));
      batch[i].block_table = tables[i];
    }
    // Chunked prefill: steps of at most the runner's max_batch_tokens (the GPU refuses more).
    absl::Status st = ForwardChunked(*runner, batch, out);
    for (auto& t : tables) blocks.Free(t);
    return st;
  };
  // Whole sequences, then all sequences in one ragged batch (a batch of one is the whole run).
  std::vector<SeqChunk> all;
  for (size_t k = 0; k < seqs.size(); ++k) {
    SeqChunk ch{seqs[k].ids, 0, {}, true};
    all.push_back(ch);
    if (!layout.runs.whole) continue;
    std::vector<float> l;
    RETURN_IF_ERROR(run({ch}, &l));
    rep.seqs.push_back(Compare(absl::StrCat("seq", k, " whole"), seqs[k], l, V, tol));
  }
  const bool batched = layout.runs.batched && seqs.size() > 1;
  std::vector<float> lb;
  if (batched) RETURN_IF_ERROR(run(all, &lb));
  int64_t off = 0;
  for (size_t k = 0; k < seqs.size() && batched; ++k) {
    int64_t n = seqs[k].ids.size() * V;
    std::vector<float> l(lb.begin() + off, lb.begin() + off + n);
    off += n;
    rep.seqs.push_back(Compare(absl::StrCat("seq", k, " batched"), seqs[k], l, V, tol));
  }
  // Prefill of the first part, then one token at a time through the KV cache.
  for (size_t k = 0; k < seqs.size() && layout.runs.decode; ++k) {
    const auto& ids = seqs[k].ids;
    const int64_t T = ids.size();
    const int64_t half = std::max<int64_t>(1, layout.decode_steps < 0 ? T / 2 : T - layout.decode_steps);
    std::vector<int32_t> table;
    RETURN_IF_ERROR(blocks.Reserve(table, T, ro.block_size));
    std::vector<float> l, step;
    const SeqChunk first_half{std::vector<int32_t>(ids.begin(), ids.begin() + half), 0, table, true};
    SlidingTables sliding(*runner);  // the sequence's sliding table across the prefill and each step
    absl::Status st = ForwardChunked(*runner, {first_half}, &l, 0, &sliding);
    for (int64_t p = half; st.ok() && p < T; ++p) {
      SeqChunk piece{{ids[p]}, p, table, false};
      st = sliding.Prepare(0, piece);
      if (st.ok()) st = runner->Forward({piece}, &step);
      l.insert(l.end(), step.begin(), step.end());
    }
    sliding.Release(0);
    blocks.Free(table);
    RETURN_IF_ERROR(st);
    rep.seqs.push_back(Compare(absl::StrCat("seq", k, " decode"), seqs[k], l, V, tol));
  }
  // Greedy generations through the serving engine, over this runner in-process.
  LocalEngineOptions eo;
  eo.max_model_len = ro.num_kv_blocks * ro.block_size;
  eo.max_tokens_per_step = ro.max_batch_tokens;
  ASSIGN_OR_RETURN(auto engine, StartLocalEngine(runner.get(), eo));
  GreedyFn greedy = [&](const std::vector<int32_t>& prompt, int64_t n) -> absl::StatusOr<std::vector<int32_t>> {
    if (n == 0) return std::vector<int32_t>{};
    EngineRequest req;
    req.prompt_ids = prompt;
    req.max_tokens = n;
    req.ignore_eos = true;  // the goldens' greedy runs are n tokens, EOS or not
    ASSIGN_OR_RETURN(LocalResult r, RunRequest(*engine, req));
    return r.tokens;
  };
  RETURN_IF_ERROR(RunGens(*gf, greedy, tol.kind, rep));
  Pool(tol, rep);
  return rep;
}

}  // namespace moeshard
