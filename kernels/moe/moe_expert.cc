// MoeExpertStep: validation, the workspace layout, and the kernels in order:
//   1. route (moe_route.cu): group the (token, slot) pairs by local expert, deterministically;
//      mark which path takes each expert (MoePath).
//   2. bf16 activations only: gather each row's x as permuted bf16, then the NVFP4
//      tensor-core gate/up (moe_nvfp4.cu) for the experts it takes; the GEMV/mma gate/up
//      (moe_gemv.cu) for Q8_0, MXFP4 and BF16 experts. With kMoeNvfp4Repacked in
//      expert_formats, the NVFP4 experts take the streaming kernels instead
//      (moe_stream.cuh), which read x and h in place: no gather; so do MXFP4 experts
//      repacked by MoeRepackMxfp4 (NVFP4-format views; kMoeMxfp4Repacked: e8m0 scale bytes) and
//      Q8_0 experts repacked by MoeRepackQ8 (kMoeQ8Repacked: int8 codes, moe_q8_stream.cu).
//   3. generic gate/up (moe_generic.cu) for all other experts (its blocks of taken experts
//      return at once).
//   4. the same three for down.
//   With MoeWork::wgmma (prefill sizes on Hopper, see WgmmaShape), the GEMV/mma path's
//   experts take moe_wgmma.cu instead of moe_gemv.cu (gather, weight expansion, two GEMMs).
//   5. combine (moe_route.cu): per token, in slot order, norm and weighted sum into out.
// MoeExpertParams::expert_formats (when the caller sets it) drops the launches that no
// expert needs; when it says every expert takes the GEMV/mma path, decode-sized steps (at most
// kMoeDirectMaxPairs pairs) skip the route too (MoeWork::direct; MOESHARD_MOE_DIRECT=0 off),
// through moe_direct.cu when every expert is Q8_0 or MXFP4 (MOESHARD_MOE_DIRECT_V2=0: through
// moe_gemv.cu's first version). MOESHARD_MOE_GEMV=0 in the environment turns the GEMV/mma path off.
// Nothing here synchronizes with the host: the kernels read the counts the route wrote.
#include "kernels/moe/moe_expert.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"
#include "kernels/moe/moe_env.h"
#include "kernels/moe/moe_launch.h"
#include "kernels/moe/moe_stream_decode.h"

namespace moeshard::gpu {
namespace {

constexpr size_t kAlign = 256;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of the workspace's buffers; `end` is the total.
struct Layout {
  size_t offsets, tile_base, gemv_base, fast, sw_next, rows, pos, xg, h, y, fix_count, fix_part, wexp, end;
  size_t end_with_wexp;  // end plus the wgmma path's expanded weights (MoeWork::wexp)
};

Layout MakeLayout(int E, int64_t L, int64_t I, int64_t T, int top_k) {
  const size_t cap = static_cast<size_t>(T) * top_k;
  Layout l;
  size_t o = 0;
  l.offsets = o, o = AlignUp(o + sizeof(int32_t) * (E + 1));
  l.tile_base = o, o = AlignUp(o + sizeof(int32_t) * (E + 1));
  l.gemv_base = o, o = AlignUp(o + sizeof(int32_t) * (E + 1));
  l.fast = o, o = AlignUp(o + E);
  l.sw_next = o, o = AlignUp(o + sizeof(int32_t) * 2);
  l.rows = o, o = AlignUp(o + sizeof(int32_t) * cap);
  l.pos = o, o = AlignUp(o + sizeof(int32_t) * cap);
  l.xg = o, o = AlignUp(o + sizeof(uint16_t) * cap * L);
  l.h = o, o = AlignUp(o + sizeof(float) * cap * I);
  l.y = o, o = AlignUp(o + sizeof(float) * cap * L);
  l.fix_count = o, o = AlignUp(o + sizeof(uint32_t) * kMoeFixBlocks);
  l.fix_part = o, o = AlignUp(o + sizeof(float) * size_t{kMoeFixBlocks} * 2 * kMoeFixSlotFloats);
  l.end = o;
  l.wexp = o;
  l.end_with_wexp = AlignUp(o + sizeof(uint16_t) * 3 * static_cast<size_t>(E) * L * I);
  return l;
}

// The wgmma path (moe_wgmma.cu, MOESHARD_MOE_WGMMA=0 off): from this many grouped rows up
// (MOESHARD_MOE_WGMMA_MIN_ROWS, default 64 a local expert on average: on the H200 at the
// Qwen3-30B shape, MXFP4, the GEMV/mma kernels win at 32 (636 against 1,048 us), the two are
// level at 64 (1,103 against 1,086) and the wgmma path leads from there: 3,877 against 1,627 us
// at 256), when the sizes fit its tiles (L a multiple of 128, I of 64; moe_wgmma.cu takes 256-row
// weight tiles where L is a multiple of 256 and I of 128).
bool WgmmaShape(int E, int64_t L, int64_t I, int64_t rows) {
  static const int64_t min_rows = [] {
    const char* v = std::getenv("MOESHARD_MOE_WGMMA_MIN_ROWS");
    return v && *v ? std::atoll(v) : int64_t{-1};
  }();
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_MOE_WGMMA");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  const int64_t need = min_rows >= 0 ? min_rows : int64_t{64} * E;
  // 3·I·L/32 < 2^31: the expansion pass indexes one expert's blocks in 32 bits.
  return on && E <= kMoeWgmmaMaxExperts && L % 128 == 0 && I % 64 == 0 && 3 * I * (L / 32) < (int64_t{1} << 31) &&
         rows >= std::max<int64_t>(need, 1);
}

absl::Status Validate(const MoeExpertParams& p) {
  if (p.num_local_experts <= 0 || p.num_local_experts > 4096 || p.width <= 0 || p.inter <= 0 || p.top_k <= 0 ||
      p.top_k > 64 || p.num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("MoeExpertStep: bad sizes: experts=", p.num_local_experts,
                                                   " width=", p.width, " inter=", p.inter, " tokens=", p.num_tokens,
                                                   " top_k=", p.top_k));
  }
  if (p.num_total_experts < 0 || (p.num_total_experts > 0 && p.num_total_experts < p.num_local_experts)) {
    return absl::InvalidArgumentError(absl::StrCat("MoeExpertStep: num_total_experts ", p.num_total_experts,
                                                   " below the ", p.num_local_experts, " local experts"));
  }
  if (p.num_tokens > (int64_t{1} << 31) / p.top_k) {
    return absl::InvalidArgumentError(absl::StrCat("MoeExpertStep: too many tokens: ", p.num_tokens));
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  if (!p.experts || !p.expert_ids || !p.weights || !p.x || !p.out || !p.workspace) {
    return absl::InvalidArgumentError("MoeExpertStep: a device pointer is null");
  }
  if (p.out_act && (p.act_dtype != ActDType::kBF16 || reinterpret_cast<uintptr_t>(p.out_act) % 8 != 0)) {
    return absl::InvalidArgumentError("MoeExpertStep: out_act needs act_dtype bf16 and 8-byte alignment");
  }
  if (reinterpret_cast<uintptr_t>(p.workspace) % kAlign != 0) {
    return absl::InvalidArgumentError("MoeExpertStep: workspace must be 256-byte aligned");
  }
  if ((p.expert_formats & kMoeMxfp4Repacked) && !(p.expert_formats & kMoeNvfp4Repacked)) {
    return absl::InvalidArgumentError("MoeExpertStep: kMoeMxfp4Repacked needs kMoeNvfp4Repacked");
  }
  if ((p.expert_formats & kMoeQ8Repacked) && !(p.expert_formats & kMoeNvfp4Repacked)) {
    return absl::InvalidArgumentError("MoeExpertStep: kMoeQ8Repacked needs kMoeNvfp4Repacked");
  }
  if ((p.expert_formats & kMoeQ8Repacked) && (p.expert_formats & kMoeMxfp4Repacked)) {
    return absl::InvalidArgumentError("MoeExpertStep: kMoeQ8Repacked and kMoeMxfp4Repacked exclude each other");
  }
  // Repacked views are NVFP4-format views (MoeRepackNvfp4 / MoeRepackMxfp4 / MoeRepackQ8): a hint
  // computed from the stored views instead would send them down a path that cannot read them.
  if ((p.expert_formats & kMoeNvfp4Repacked) && !(p.expert_formats & MoeFormatBit(WeightFormat::kNVFP4))) {
    return absl::InvalidArgumentError(
        "MoeExpertStep: kMoeNvfp4Repacked without the NVFP4 format bit (compute the hint from the repacked views)");
  }
  if ((p.expert_formats & kMoeNvfp4Repacked) &&
      (p.act_dtype != ActDType::kBF16 || reinterpret_cast<uintptr_t>(p.x) % 16 != 0 || p.width % 256 != 0 ||
       p.inter % 256 != 0)) {
    return absl::InvalidArgumentError(
        "MoeExpertStep: repacked NVFP4 experts need bf16 activations (16-byte aligned) and L, I multiples of 256");
  }
  const size_t need = MoeExpertWorkspaceBytes(p.num_local_experts, p.width, p.inter, p.num_tokens, p.top_k);
  if (p.workspace_bytes < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoeExpertStep: workspace of ", p.workspace_bytes, " bytes, need ", need));
  }
  return absl::OkStatus();
}

bool DirectEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_MOE_DIRECT");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

bool DirectV2Enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_MOE_DIRECT_V2");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

// Q8_0 experts through moe_direct.cu too (MOESHARD_MOE_DIRECT_V2_Q8=1). Off by default: on the
// H200 its Q8_0 path measured level with the first version's (kernels/moe/PERF_NOTES.md).
bool DirectV2Q8Enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_MOE_DIRECT_V2_Q8");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}

// The direct GEMV over the repacked layouts (moe_stream_direct.cu); MOESHARD_MOE_STREAM_DIRECT=0
// turns it off (the route and the streaming kernels at every size).
bool StreamDirectEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_MOE_STREAM_DIRECT");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

// Where the direct GEMV over repacked experts beats the route and the streaming kernels (H200,
// 2026-12-05, docs/PERFORMANCE.md): one token's pairs at any size; more pairs only for experts of
// at most 2^22 weights a matrix (Qwen3-30B's 2,048 x 768: 1 / 4 tokens 26 / 56 us against 54 / 77,
// level at 16 and 64), not for larger ones (Muse Spark's 8,192 x 4,096 at 4 tokens: 3.20 ms of
// experts a step against 2.57).
bool StreamDirectShape(int64_t pairs, int64_t width, int64_t inter) {
  return pairs <= 8 || width * inter <= (int64_t{1} << 22);
}

// The wgmma GEMMs for prefill-sized steps of MXFP4 and Q8_0 experts in the streaming layouts
// (MoeWork::wgmma_repacked) on request (MOESHARD_MOE_WGMMA_REPACKED=1) until it has run on a GPU.
bool WgmmaRepackedEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_MOE_WGMMA_REPACKED");
    return v && std::strcmp(v, "1") == 0;
  }();
  return on;
}

// The wgmma GEMMs over repacked NVFP4 / MXFP4 experts (moe_stream_wgmma.cu; MOESHARD_MOE_STREAM_WGMMA=0
// off): every expert from this many expected local rows up (MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS;
// default 20 a local expert on average); below that, on request, from 4 an expert on average
// (MOESHARD_MOE_SW_SPLIT_FROM), the experts with at least MOESHARD_MOE_SW_SPLIT_ROWS rows (default
// 0: never), counted by the route on the device, beside the streaming kernels for the rest
// (moe_stream_decode.h PlanStreamWgmma). The split runs as launches after the streaming kernels'
// and lost 4-15 % wherever measured but zipf routing at 512 tokens (-16 %; H100, 2026-12-06,
// kernels/moe/PERF_NOTES.md): off until both sides share one launch. The all-threshold, measured
// on an H100, 2026-12-05, thirteenth session (kernels/moe/PERF_NOTES.md): at Muse Spark's expert
// size (32 of 256 experts, L = I = 4,096) 94 rows an expert take 0.80 ms against the streaming
// kernels' 1.36, 23 rows 0.43 against 0.43 (zipf routing 0.61 against 0.77), 2 rows 0.36 against
// 0.29; at Qwen3-30B's (128 experts, 2,048 x 768) 64 rows 0.40 against 0.46 ms, 16 rows 0.22
// against 0.20.
StreamWgmmaPlan StreamWgmmaPlanFor(int E, int64_t L, int64_t I, int64_t capacity, int64_t rows) {
  static const int64_t min_rows = [] {
    const char* v = std::getenv("MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS");
    return v && *v ? std::atoll(v) : int64_t{-1};
  }();
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_MOE_STREAM_WGMMA");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  static const int split_rows = EnvInt("MOESHARD_MOE_SW_SPLIT_ROWS", 0);
  static const int split_from = EnvInt("MOESHARD_MOE_SW_SPLIT_FROM", 4);
  if (!on || !MoeStreamWgmmaSupported(E, L, I, capacity)) return {};
  return PlanStreamWgmma(E, rows, min_rows >= 0 ? min_rows : int64_t{20} * E, split_rows, split_from);
}

// Whether an all-wgmma step takes the two-CTA 32-token kernel beside the 128-token one (sets MoeWork::sw_pair,
// sw_min_rows 33, the order sw_big_first and the item source sw_dyn):
// MOESHARD_MOE_SW_PAIR (no item size forced by MOESHARD_MOE_SW_TOK) 1 or 2 (the 128-token kernel first, the
// default) when the host's rule expects at most 32 rows an expert (moe_stream_decode.h StreamWgmmaItemTokens),
// 3 or 4 (the 128-token kernel first) at every size (tests), 0 never. On by default since 2026-12-06 (seventeenth
// session), with the two-CTA kernel drawing its items from a counter (MOESHARD_MOE_SW_DYN, default 1): H100, same
// draws, against 64-token items at T = 640-753 (issue shape), zipf routing -4 to -17 %, uniform +4 % to -3 %.
// With items strided over a static grid it had added 14 % at T = 753 uniform (H200): an expert or two past 32 rows
// left the 128-token kernel's items as a tail.
void StreamWgmmaPairFor(int64_t capacity, int64_t total_experts, MoeWork& w) {
  static const int mode = EnvInt("MOESHARD_MOE_SW_TOK", 0) == 0 ? EnvInt("MOESHARD_MOE_SW_PAIR", 2) : 0;
  static const bool dyn = EnvInt("MOESHARD_MOE_SW_DYN", 1) == 1;
  if (mode == 3 || mode == 4 || ((mode == 1 || mode == 2) && StreamWgmmaItemTokens(capacity, total_experts) == 32)) {
    w.sw_pair = true;
    w.sw_min_rows = 33;
    w.sw_big_first = mode % 2 == 0;
    w.sw_dyn = dyn;
  }
}

// A split step (MoeWork::stream_split): the streaming kernels over the experts the route left them,
// then the wgmma GEMMs over those it marked kMoePathSw; each launch passes over the other's experts.
cudaError_t LaunchSplitGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  if (cudaError_t err = LaunchMoeStreamGateUp(p, w, stream); err != cudaSuccess) return err;
  return LaunchMoeStreamWgmmaGateUp(p, w, stream);
}
cudaError_t LaunchSplitDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  if (cudaError_t err = LaunchMoeStreamDown(p, w, stream); err != cudaSuccess) return err;
  return LaunchMoeStreamWgmmaDown(p, w, stream);
}

bool GemvEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_MOE_GEMV");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

std::atomic<uint64_t> g_steps{0}, g_stream{0}, g_stream_direct{0}, g_direct{0}, g_wgmma{0}, g_wgmma_repacked{0},
    g_stream_wgmma{0}, g_stream_split{0}, g_stream_wgmma_pair{0}, g_generic{0}, g_down_residual{0};

void CountPaths(const MoeWork& w, bool repacked, bool need_generic) {
  constexpr auto kRelaxed = std::memory_order_relaxed;
  g_steps.fetch_add(1, kRelaxed);
  if (repacked) g_stream.fetch_add(1, kRelaxed);
  if (w.stream_direct) g_stream_direct.fetch_add(1, kRelaxed);
  if (w.direct && !w.stream_direct) g_direct.fetch_add(1, kRelaxed);
  if (w.wgmma) g_wgmma.fetch_add(1, kRelaxed);
  if (w.wgmma_repacked) g_wgmma_repacked.fetch_add(1, kRelaxed);
  if (w.stream_wgmma) g_stream_wgmma.fetch_add(1, kRelaxed);
  if (w.stream_split) g_stream_split.fetch_add(1, kRelaxed);
  if (w.sw_pair) g_stream_wgmma_pair.fetch_add(1, kRelaxed);
  if (need_generic) g_generic.fetch_add(1, kRelaxed);
  if (w.res_s) g_down_residual.fetch_add(1, kRelaxed);
}

// MoeExpertStepResidual's down kernel with the residual update inside; MOESHARD_MOE_DOWN_RESIDUAL=0
// turns it off (the caller then takes MoeExpertStepRows and the residual kernel).
bool DownResidualEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_MOE_DOWN_RESIDUAL");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

}  // namespace

MoePathCounts MoeExpertPathCounts() {
  constexpr auto kRelaxed = std::memory_order_relaxed;
  return {g_steps.load(kRelaxed),        g_stream.load(kRelaxed),       g_stream_direct.load(kRelaxed),
          g_direct.load(kRelaxed),       g_wgmma.load(kRelaxed),        g_wgmma_repacked.load(kRelaxed),
          g_stream_wgmma.load(kRelaxed), g_stream_split.load(kRelaxed), g_stream_wgmma_pair.load(kRelaxed),
          g_generic.load(kRelaxed),      g_down_residual.load(kRelaxed)};
}

void SetMoeDirectWarpFormForTest(int mask, int max_blocks) {
  DirectWarpHold().mask.store(mask, std::memory_order_relaxed);
  DirectWarpHold().max_blocks.store(max_blocks, std::memory_order_relaxed);
}

uint32_t MoeExpertFormats(const MoeExpertWeights* experts, int num_local_experts, int64_t width, int64_t inter) {
  uint32_t bits = kMoeAllViewsFast;
  const bool nvfp4_sizes = width % 256 == 0 && inter % 256 == 0;
  for (int e = 0; e < num_local_experts; ++e) {
    const MoeExpertWeights& ew = experts[e];
    bits |= MoeFormatBit(ew.gate.format) | MoeFormatBit(ew.up.format) | MoeFormatBit(ew.down.format);
    const bool fast = (nvfp4_sizes && MoeNvfp4Eligible(ew, width, inter)) || MoeGemvEligible(ew, width, inter);
    if (!fast) bits &= ~kMoeAllViewsFast;
  }
  return bits;
}

size_t MoeExpertWorkspaceBytes(int num_local_experts, int64_t width, int64_t inter, int64_t num_tokens, int top_k,
                               uint32_t expert_formats) {
  const Layout l = MakeLayout(num_local_experts, width, inter, num_tokens, top_k);
  const uint32_t gemv_bits =
      MoeFormatBit(WeightFormat::kQ8_0) | MoeFormatBit(WeightFormat::kMXFP4) | MoeFormatBit(WeightFormat::kBF16);
  const uint32_t repacked_gemv = kMoeMxfp4Repacked | kMoeQ8Repacked;  // whole matrices, GEMV formats
  const bool wgmma = ((expert_formats & gemv_bits) || ((expert_formats & repacked_gemv) && WgmmaRepackedEnabled())) &&
                     MoeWgmmaSupported() && WgmmaShape(num_local_experts, width, inter, num_tokens * top_k);
  return wgmma ? l.end_with_wexp : l.end;
}

cudaError_t MoeExpertStepStages(const MoeExpertParams& p, unsigned mask, cudaStream_t stream) {
  return MoeExpertStepStagesRes(p, mask, nullptr, nullptr, nullptr, stream);
}

cudaError_t MoeExpertStepStagesRes(const MoeExpertParams& p, unsigned mask, float* res_s, const float* res_pre,
                                   bool* res_taken, cudaStream_t stream) {
  if (res_taken) *res_taken = false;
  const int num_sms = DeviceSmCount();
  if (num_sms == 0) return cudaErrorNoDevice;
  const Layout l = MakeLayout(p.num_local_experts, p.width, p.inter, p.num_tokens, p.top_k);
  uint8_t* ws = static_cast<uint8_t*>(p.workspace);
  MoeWork w;
  w.capacity = p.num_tokens * p.top_k;
  w.offsets = reinterpret_cast<int32_t*>(ws + l.offsets);
  w.tile_base = reinterpret_cast<int32_t*>(ws + l.tile_base);
  w.gemv_base = reinterpret_cast<int32_t*>(ws + l.gemv_base);
  w.fast = ws + l.fast;
  w.sw_next = reinterpret_cast<int32_t*>(ws + l.sw_next);
  w.rows = reinterpret_cast<int32_t*>(ws + l.rows);
  w.pos = reinterpret_cast<int32_t*>(ws + l.pos);
  w.xg = reinterpret_cast<uint16_t*>(ws + l.xg);
  w.h = ws + l.h;
  w.y = reinterpret_cast<float*>(ws + l.y);
  w.fix_count = reinterpret_cast<uint32_t*>(ws + l.fix_count);
  w.fix_part = reinterpret_cast<float*>(ws + l.fix_part);
  w.wexp = reinterpret_cast<uint16_t*>(ws + l.wexp);
  w.num_sms = num_sms;
  const bool bf16 = p.act_dtype == ActDType::kBF16 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  const uint32_t fmts = p.expert_formats;  // 0: unknown
  const bool known = fmts != 0;
  const uint32_t gemv_bits =
      MoeFormatBit(WeightFormat::kQ8_0) | MoeFormatBit(WeightFormat::kMXFP4) | MoeFormatBit(WeightFormat::kBF16);
  const uint32_t nvfp4_bit = MoeFormatBit(WeightFormat::kNVFP4);
  w.fast_allowed = bf16 && p.width % 256 == 0 && p.inter % 256 == 0 && (!known || (fmts & nvfp4_bit));
  w.gemv_allowed = bf16 && GemvEnabled() && p.width % 32 == 0 && p.inter % 32 == 0 && (!known || (fmts & gemv_bits));
  // The generic launches can be left out only when the caller vouches that every expert
  // qualifies for a fast path that is on for this call.
  bool need_generic = true;
  if (known && (fmts & kMoeAllViewsFast) && bf16) {
    const uint32_t present = fmts & ~kMoeHintFlags;
    uint32_t covered = 0;
    if (w.fast_allowed) covered |= nvfp4_bit;
    if (w.gemv_allowed) covered |= gemv_bits;
    need_generic = (present & ~covered) != 0;
  }
  // Decode-sized steps whose experts all take the GEMV/mma path skip the route stage.
  w.direct = DirectEnabled() && w.gemv_allowed && !need_generic && known &&
             (fmts & ~(kMoeHintFlags | gemv_bits)) == 0 && p.num_tokens * p.top_k <= kMoeDirectMaxPairs;
  w.direct_v2 = w.direct && DirectV2Enabled() && (fmts & MoeFormatBit(WeightFormat::kBF16)) == 0 &&
                ((fmts & MoeFormatBit(WeightFormat::kQ8_0)) == 0 || DirectV2Q8Enabled());
  // Prefill sizes on Hopper: the GEMV/mma path's experts through the wgmma GEMMs, when the
  // caller's workspace has room for the expanded weights (MoeExpertWorkspaceBytes with the
  // formats). Chosen from sizes alone, so the format hint never changes a result.
  w.wgmma = w.gemv_allowed && !w.direct && p.workspace_bytes >= l.end_with_wexp && MoeWgmmaSupported() &&
            WgmmaShape(p.num_local_experts, p.width, p.inter, w.capacity);
  // Repacked NVFP4 weights: the streaming kernels read x and h as they are (no gather).
  const bool repacked = known && (fmts & kMoeNvfp4Repacked);
  w.stream_mx = repacked && (fmts & kMoeMxfp4Repacked);
  w.stream_q8 = repacked && (fmts & kMoeQ8Repacked);
  // Decode sizes of repacked experts: the direct GEMV over the streaming layout, no route.
  if (repacked && w.fast_allowed && !need_generic && DirectEnabled() && StreamDirectEnabled() &&
      w.capacity <= kMoeDirectMaxPairs && StreamDirectShape(w.capacity, p.width, p.inter)) {
    w.direct = w.stream_direct = true;
  }
  // Prefill sizes of repacked MXFP4 / Q8_0 experts: the wgmma GEMMs, their expansion pass reading
  // the streaming layouts (the same bf16 values as from the stored blocks).
  w.wgmma_repacked = (w.stream_mx || w.stream_q8) && w.fast_allowed && !need_generic && !w.stream_direct &&
                     WgmmaRepackedEnabled() && p.workspace_bytes >= l.end_with_wexp && MoeWgmmaSupported() &&
                     WgmmaShape(p.num_local_experts, p.width, p.inter, w.capacity);
  if (w.wgmma_repacked) w.wgmma = true;
  // Prefill sizes of repacked NVFP4 / MXFP4 experts: wgmma over weights decoded into registers,
  // chosen by this GPU's expected share of the pairs (the route's counts stay on the device).
  const int64_t total_experts = p.num_total_experts > 0 ? p.num_total_experts : p.num_local_experts;
  const int64_t expected_rows = w.capacity * p.num_local_experts / total_experts;
  if (repacked && !w.stream_q8 && w.fast_allowed && !need_generic && !w.stream_direct && !w.wgmma_repacked) {
    const StreamWgmmaPlan plan = StreamWgmmaPlanFor(p.num_local_experts, p.width, p.inter, w.capacity, expected_rows);
    w.stream_wgmma = plan.all;
    w.stream_split = plan.split_rows > 0;
    w.sw_min_rows = plan.split_rows;
    if (w.stream_wgmma) StreamWgmmaPairFor(w.capacity, total_experts, w);
  }
  if (res_s) {  // the residual update inside down, or nothing launched
    if (!w.stream_direct || !MoeDownResidualShape(p) || !DownResidualEnabled()) return cudaSuccess;
    w.res_s = res_s;
    w.res_pre = res_pre;
    *res_taken = true;
  }
  CountPaths(w, repacked, need_generic);
  using Launch = cudaError_t (*)(const MoeExpertParams&, const MoeWork&, cudaStream_t);
  enum Need { kAlways, kFast, kFastOld, kGemv, kGeneric };
  const struct {
    unsigned stage;
    Need need;
    Launch launch;
  } stages[] = {
      {kMoeStageRoute, kAlways, LaunchMoeRoute},
      {kMoeStageGather, kFastOld, LaunchMoeGatherX},
      {kMoeStageFastGateUp, kFast,
       w.stream_direct  ? LaunchMoeStreamDirectGateUp
       : w.stream_wgmma ? LaunchMoeStreamWgmmaGateUp
       : w.stream_split ? LaunchSplitGateUp
       : repacked       ? LaunchMoeStreamGateUp
                        : LaunchMoeFastGateUp},
      {kMoeStageGemvGateUp, kGemv, w.wgmma ? LaunchMoeWgmmaGateUp : LaunchMoeGemvGateUp},
      {kMoeStageGenericGateUp, kGeneric, LaunchMoeGenericGateUp},
      {kMoeStageFastDown, kFast,
       w.res_s           ? LaunchMoeStreamDirectDownResidual
       : w.stream_direct ? LaunchMoeStreamDirectDown
       : w.stream_wgmma  ? LaunchMoeStreamWgmmaDown
       : w.stream_split  ? LaunchSplitDown
       : repacked        ? LaunchMoeStreamDown
                         : LaunchMoeFastDown},
      {kMoeStageGemvDown, kGemv, w.wgmma ? LaunchMoeWgmmaDown : LaunchMoeGemvDown},
      {kMoeStageGenericDown, kGeneric, LaunchMoeGenericDown},
      {kMoeStageCombine, kAlways, LaunchMoeCombine},
  };
  for (const auto& s : stages) {
    if (!(mask & s.stage) || (w.res_s && s.stage == kMoeStageCombine)) continue;
    if (w.direct && (s.stage == kMoeStageRoute || s.need == kFastOld || (s.need == kFast && !w.stream_direct))) {
      continue;
    }
    if (((s.need == kFast || s.need == kFastOld) && (!w.fast_allowed || w.wgmma_repacked)) ||
        (s.need == kFastOld && repacked) || (s.need == kGemv && !w.gemv_allowed && !w.wgmma_repacked) ||
        (s.need == kGeneric && !need_generic)) {
      continue;
    }
    // The pair step's item counters are zeroed by the route; a GEMM stage run without it (benchmarks'
    // stages alone, MoeExpertStepStages) zeroes them first, or its two-CTA kernel would start from
    // the last run's count and take one item a CTA.
    if (w.sw_pair && w.sw_next != nullptr && !(mask & kMoeStageRoute) &&
        (s.stage == kMoeStageFastGateUp || s.stage == kMoeStageFastDown)) {
      if (cudaError_t err = cudaMemsetAsync(w.sw_next, 0, 2 * sizeof(int32_t), stream); err != cudaSuccess) return err;
    }
    if (cudaError_t err = s.launch(p, w, stream); err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

namespace {

// MoeRepackNvfp4 / MoeRepackMxfp4 / MoeRepackQ8: the checks, the launch and the dense NVFP4-format
// view (code_bits 4, or 8 for Q8_0's int8 codes; scale bytes a row: cols / scale_cols).
absl::StatusOr<WeightRef> Repack(const char* name, bool eligible, const char* need, const WeightRef& src,
                                 void* dst_data, void* dst_scale, float scale2, int code_bits, int scale_cols,
                                 cudaError_t (*launch)(const WeightRef&, void*, void*, cudaStream_t),
                                 GpuStream stream) {
  if (!eligible) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": needs ", need, "; got ", src.rows, " x ", src.cols, " at column ", src.col_offset));
  }
  if (!dst_data || !dst_scale || reinterpret_cast<uintptr_t>(dst_data) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(dst_scale) % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": destinations must be non-null and 16-byte aligned"));
  }
  const std::string what = absl::StrCat(name, " launch");
  if (absl::Status s = CudaStatus(launch(src, dst_data, dst_scale, stream), what.c_str()); !s.ok()) return s;
  WeightRef r;
  r.format = WeightFormat::kNVFP4;
  r.rows = src.rows;
  r.cols = src.cols;
  r.data = static_cast<const uint8_t*>(dst_data);
  r.row_stride_bytes = src.cols * code_bits / 8;
  r.scale = static_cast<const uint8_t*>(dst_scale);
  r.scale_row_stride = src.cols / scale_cols;
  r.scale2 = scale2;
  return r;
}

}  // namespace

absl::StatusOr<WeightRef> MoeRepackNvfp4(const WeightRef& src, void* dst_data, void* dst_scale, GpuStream stream) {
  return Repack("MoeRepackNvfp4", MoeRepackNvfp4Eligible(src),
                "an NVFP4 view with rows % 16 == 0, cols % 256 == 0 and col_offset % 16 == 0", src, dst_data, dst_scale,
                src.scale2, 4, 16, LaunchMoeRepackNvfp4, stream);
}

absl::StatusOr<WeightRef> MoeRepackMxfp4(const WeightRef& src, void* dst_data, void* dst_scale, GpuStream stream) {
  return Repack("MoeRepackMxfp4", MoeRepackMxfp4Eligible(src),
                "an MXFP4 view with rows % 16 == 0, cols % 256 == 0 and col_offset % 32 == 0", src, dst_data, dst_scale,
                1.0f, 4, 32, LaunchMoeRepackMxfp4, stream);
}

absl::StatusOr<WeightRef> MoeRepackQ8(const WeightRef& src, void* dst_data, void* dst_scale, GpuStream stream) {
  return Repack("MoeRepackQ8", MoeRepackQ8Eligible(src),
                "a Q8_0 view with rows % 16 == 0, cols % 256 == 0 and col_offset % 32 == 0", src, dst_data, dst_scale,
                1.0f / 256, 8, 16, LaunchMoeRepackQ8, stream);
}

bool MoeQ8Repackable(const WeightRef& view) { return MoeRepackQ8Eligible(view); }

absl::StatusOr<bool> MoeMxfp4Repackable(const WeightRef* views, int n, GpuStream stream) {
  for (int i = 0; i < n; ++i) {
    if (!MoeRepackMxfp4Eligible(views[i])) return false;
  }
  if (n == 0) return true;
  int* bad = nullptr;
  if (absl::Status s = CudaStatus(cudaMalloc(&bad, sizeof(int)), "MoeMxfp4Repackable alloc"); !s.ok()) return s;
  absl::Status st = CudaStatus(cudaMemsetAsync(bad, 0, sizeof(int), stream), "MoeMxfp4Repackable memset");
  for (int i = 0; i < n && st.ok(); ++i) {
    st = CudaStatus(LaunchMoeMxfp4ScaleCheck(views[i], bad, stream), "MoeMxfp4Repackable launch");
  }
  int host = 1;
  if (st.ok()) st = CudaStatus(cudaMemcpyAsync(&host, bad, sizeof(int), cudaMemcpyDeviceToHost, stream), "copy");
  if (st.ok()) st = CudaStatus(cudaStreamSynchronize(stream), "MoeMxfp4Repackable sync");
  cudaFree(bad);
  if (!st.ok()) return st;
  return host == 0;
}

absl::Status MoeExpertStep(const MoeExpertParams& p, GpuStream stream) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.num_tokens == 0) return absl::OkStatus();
  return CudaStatus(MoeExpertStepStages(p, kMoeStageAll, stream), "MoeExpertStep launch");
}

absl::StatusOr<bool> MoeExpertStepResidual(const MoeExpertParams& p, float* s, const float* pre_add, GpuStream stream) {
  if (p.out_act) return absl::InvalidArgumentError("MoeExpertStepResidual: out_act needs the combine (MoeExpertStep)");
  if (absl::Status st = Validate(p); !st.ok()) return st;
  if (!s || reinterpret_cast<uintptr_t>(s) % 4 != 0 || (pre_add && reinterpret_cast<uintptr_t>(pre_add) % 4 != 0)) {
    return absl::InvalidArgumentError("MoeExpertStepResidual: s (and pre_add) must be 4-byte aligned device rows");
  }
  if (p.num_tokens != 1) return false;
  bool taken = false;
  if (absl::Status st =
          CudaStatus(MoeExpertStepStagesRes(p, kMoeStageAll & ~kMoeStageCombine, s, pre_add, &taken, stream),
                     "MoeExpertStep launch");
      !st.ok()) {
    return st;
  }
  return taken;
}

absl::StatusOr<MoeExpertRows> MoeExpertStepRows(const MoeExpertParams& p, GpuStream stream) {
  if (p.out_act) return absl::InvalidArgumentError("MoeExpertStepRows: out_act needs the combine (MoeExpertStep)");
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.output_norm) return absl::InvalidArgumentError("MoeExpertStepRows: the output norm needs the combine");
  const Layout l = MakeLayout(p.num_local_experts, p.width, p.inter, p.num_tokens, p.top_k);
  uint8_t* ws = static_cast<uint8_t*>(p.workspace);
  MoeExpertRows r{reinterpret_cast<const float*>(ws + l.y), reinterpret_cast<const int32_t*>(ws + l.pos)};
  if (p.num_tokens == 0) return r;
  if (absl::Status s =
          CudaStatus(MoeExpertStepStages(p, kMoeStageAll & ~kMoeStageCombine, stream), "MoeExpertStep launch");
      !s.ok()) {
    return s;
  }
  return r;
}

}  // namespace moeshard::gpu
