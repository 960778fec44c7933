// Split-K decode attention on the tensor cores, for bf16 activations over a bf16 or FP8 KV
// cache: the same split of each token's visible keys as attention_decode.cu (DecodeSplitOf)
// and the same workspace layout, so its combine kernel merges the partials.
//
// One CTA of 4 warps per (split, KV head, token). The KV head's GQA query heads are the rows
// of one m16 tile (group <= 16; rows past the group are zero and never stored), held as bf16
// A fragments for the whole CTA. Keys stream through a three-stage cp.async ring, 64 keys a
// stage; warp w takes keys [16 w, 16 w + 16) of every stage with its own online-softmax
// state: S = Q Kᵀ (mma.sync m16n8k16, K's B fragments by ldmatrix), fp32 softmax on the
// accumulator fragments, P rounded to bf16 and fed back as the A operand of O += P V (V's B
// fragments by ldmatrix.trans), the FA2 register layout of attention_tc.cu. The four warps'
// (max, sum, O) merge through shared memory at the end. An FP8 cache stages its raw bytes and
// scales; each warp converts its own 16 keys of K to fp16 (exact for e4m3; one instruction per
// two values) into warp-private rows, and after the scores its 16 keys of V into the same rows
// (half the shared memory: three CTAs an SM); the mmas run on fp16 operands (Q rounded to fp16,
// which holds bf16 values exactly within its range; P in fp16): K's scale multiplies the key's score,
// V's scale the key's probability in P (the softmax sum uses the unscaled one). Scores are
// scaled in fp32.
//
// Fused (LaunchAttentionDecodeFused, one token per sequence, short contexts): the kernel also
// does QkPrep's work — the group's query heads normed and rotated into the Q tile, the new
// position's key and value head normed, rotated and written to the cache by the split that
// reads them, before it loads its keys (qk_prep.cuh: the same values QkPrep computes) — and
// the splits of one (token, KV head) are one thread-block cluster whose partials merge through
// distributed shared memory: one launch a layer instead of QkPrep + split kernel + combine.
// The new key and value rows go into the ring of the split that reads them as well as to the
// cache, so that split's key loads start right after the wait (no fence, no barrier).
//
// Why: the fp32-FMA decode kernels spend ~4 instructions per K/V element (convert, FMA, shared
// loads) and are instruction-bound far below memory bandwidth at long contexts (a 128K-token
// Qwen3-30B-shaped decode step read KV at ~1 TB/s); here a K/V element costs a fraction of an
// mma and the loop is bound by the copy.
#include <cuda_fp8.h>

#include <cooperative_groups.h>

#include <cstdlib>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_decode_tc.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/qk_prep.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kThreads = 128, kChunk = 64, kStages = 3, kRows = kTcRows;

template <int HD, KvElem E>
struct TcGeo {
  static constexpr int kLd = HD + 8;                               // bf16 elements per padded row
  static constexpr int kBf16Stage = 2 * kChunk * kLd * 2;          // K and V of a stage, bytes
  static constexpr int kRawStage = E == KvElem::kBF16 ? kBf16Stage  // bf16: the ring holds bf16 rows
                                                      : 2 * kChunk * HD + 2 * kChunk * 4;  // FP8 K, V, scales
  static constexpr int kQBytes = kRows * kLd * 2;
  static constexpr int kWork = E == KvElem::kBF16 ? 0 : kChunk * kLd * 2;  // FP8: each warp's fp16 rows, K then V
  static constexpr int kLoop = kQBytes + kStages * kRawStage + kWork;
  static constexpr int kMerge = kTcMergeBytes<HD>;  // each warp's O, m, l (MergeWarpRows)
  static constexpr size_t kSmem = kLoop > kMerge ? kLoop : kMerge;
  // Fused: the RoPE angles, then this split's merged partial (O, m, l) that its cluster reads.
  static constexpr size_t kAngles = kSmem, kPartial = kAngles + HD * 4;
  static constexpr size_t kFusedSmem = kPartial + kRows * HD * 4 + 2 * kRows * 4;
};
constexpr int kFusedSplits = 8;  // a portable cluster

// FP8: a warp's 16 keys (rows kw..kw+15 of a stage's K or V bytes) to fp16 in the same rows of
// `work`, exact for e4m3. __syncwarp first: every lane's ldmatrix of the rows' last contents is done.
template <int HD, int LD>
__device__ __forceinline__ void Fp8RowsToF16(const uint8_t* src, int kw, int lane, uint16_t* work) {
  __syncwarp();
#pragma unroll
  for (int i = lane; i < 16 * (HD / 8); i += 32) {
    const int key = kw + i / (HD / 8), d = (i % (HD / 8)) * 8;
    const uint2 raw = *reinterpret_cast<const uint2*>(src + key * HD + d);
    const uint4 w = make_uint4(E4m3x2ToF16x2(raw.x), E4m3x2ToF16x2(raw.x >> 16), E4m3x2ToF16x2(raw.y),
                               E4m3x2ToF16x2(raw.y >> 16));
    *reinterpret_cast<uint4*>(work + key * LD + d) = w;
  }
  __syncwarp();
}

template <int HD, KvElem E, bool kFused>
__device__ __forceinline__ void DecodeTc(const AttentionParams& p, int group, int splits, float* ws,
                                         const QkPrepParams& qp) {
  using G = TcGeo<HD, E>;
  constexpr int LD = G::kLd, KS = HD / 16;
  constexpr bool F16 = E == KvElem::kFp8E4M3;
  extern __shared__ float4 smem4[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(smem4);
  uint16_t* Qs = reinterpret_cast<uint16_t*>(smem);
  uint8_t* ring = smem + G::kQBytes;
  uint16_t* work = reinterpret_cast<uint16_t*>(ring + kStages * G::kRawStage);  // FP8 only
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t t = blockIdx.z, g = blockIdx.y, sp = blockIdx.x;
  const int64_t nkv = p.cache.num_kv_heads, bs = p.cache.block_size, H = p.num_heads, hd = p.cache.head_dim;
  float* angles = reinterpret_cast<float*>(smem + G::kAngles);  // fused only
  // The angles depend on the step's positions only (uploaded before the step): before the wait.
  if constexpr (kFused) {
    if (qp.rope) QkRopeAngles(p.pos[t], qp.theta, hd, angles, tid, kThreads);
  }
  // The split and its block-table entries are step inputs too (read before the wait, below).
  const DecodeSplit split = DecodeSplitOf(p, t, sp, splits, ws);
  const int64_t kb = split.kb, ke = split.ke;
  const PagedSlots slots(p.block_tables + p.table_offset[t], bs);
  const int per = HD / 32;  // the fused kernel runs hd == HD only (DecodeFusedSupports); constant, so x[] stays in registers
  // Fused: the new position's key and value head are prepared by warp 0 of the split that reads
  // them and written twice: to the cache (for later steps) and straight into this CTA's ring
  // where the key's chunk is staged, its cp.async left out — the only read of that row in this
  // launch, so no fence and no barrier stand between the wait and the key loads.
  const int64_t pos = p.pos[t];
  const bool new_row = kFused && kb <= pos && pos < ke;  // uniform over the CTA
  const int64_t new_chunk = (pos - kb) / kChunk;
  float kx[kFused ? kQkMaxPer : 1], vx[kFused ? kQkMaxPer : 1];
  auto put_row = [&](int slot) {  // warp 0 of the new row's split: its K and V rows in ring stage `slot`
    if constexpr (kFused) {
      uint8_t* st = ring + slot * G::kRawStage;
      const int kk = static_cast<int>((pos - kb) % kChunk);
      if constexpr (E == KvElem::kBF16) {
        uint16_t* ks = reinterpret_cast<uint16_t*>(st);
        QkStoreKv<E>(ks, nullptr, int64_t{kk} * LD, 0, per, lane, kx);
        QkStoreKv<E>(ks + kChunk * LD, nullptr, int64_t{kk} * LD, 0, per, lane, vx);
      } else {
        float* kscale = reinterpret_cast<float*>(st + 2 * kChunk * HD);
        QkStoreKv<E>(st, kscale, int64_t{kk} * HD, kk, per, lane, kx);
        QkStoreKv<E>(st + kChunk * HD, kscale + kChunk, int64_t{kk} * HD, kk, per, lane, vx);
      }
    }
  };
  // Stage `slot` <- keys [c0, c0 + 64): bf16 rows (padded) or FP8 rows and their scales.
  auto issue = [&](int64_t c0, int slot) {
    uint8_t* st = ring + slot * G::kRawStage;
    if constexpr (E == KvElem::kBF16) {
      constexpr int kPieces = HD / 8;  // 16-byte pieces of a row
      uint16_t* ks = reinterpret_cast<uint16_t*>(st);
      uint16_t* vs = ks + kChunk * LD;
      const uint16_t* kc = static_cast<const uint16_t*>(p.cache.k);
      const uint16_t* vc = static_cast<const uint16_t*>(p.cache.v);
      for (int i = tid; i < kChunk * kPieces; i += kThreads) {
        const int key = i / kPieces, piece = i % kPieces;
        const int64_t kp = c0 + key;
        if (kFused && kp == pos) continue;  // put_row writes it
        const bool valid = kp < ke && piece * 8 < hd;
        const int64_t row = valid ? (slots(kp) * nkv + g) * hd : 0;
        CpAsync16(ks + key * LD + piece * 8, kc + row + piece * 8, valid);
        CpAsync16(vs + key * LD + piece * 8, vc + row + piece * 8, valid);
      }
    } else {
      constexpr int kPieces = HD / 16;
      uint8_t* ks = st;
      uint8_t* vs = ks + kChunk * HD;
      float* kscale = reinterpret_cast<float*>(vs + kChunk * HD);
      float* vscale = kscale + kChunk;
      const uint8_t* kc = static_cast<const uint8_t*>(p.cache.k);
      const uint8_t* vc = static_cast<const uint8_t*>(p.cache.v);
      for (int i = tid; i < kChunk * kPieces; i += kThreads) {
        const int key = i / kPieces, piece = i % kPieces;
        const int64_t kp = c0 + key;
        if (kFused && kp == pos) continue;  // put_row writes it
        const bool valid = kp < ke && piece * 16 < hd;
        const int64_t row = valid ? (slots(kp) * nkv + g) * hd : 0;
        CpAsync16(ks + key * HD + piece * 16, kc + row + piece * 16, valid);
        CpAsync16(vs + key * HD + piece * 16, vc + row + piece * 16, valid);
      }
      if (tid < kChunk && !(kFused && c0 + tid == pos)) {
        const int64_t kp = c0 + tid;
        const bool valid = kp < ke;
        const int64_t si = valid ? slots(kp) * nkv + g : 0;
        CpAsync4(kscale + tid, p.cache.k_scale + si, valid);
        CpAsync4(vscale + tid, p.cache.v_scale + si, valid);
      }
    }
    CpCommit();
  };

  const int64_t nchunks = (ke - kb + kChunk - 1) / kChunk;
  auto prologue = [&] {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < nchunks) {
        issue(kb + s * kChunk, s);
      } else {
        CpCommit();
      }
    }
  };
  // Fused: every key the split reads but the new position's was written by earlier steps, and the
  // block table and positions are the step's inputs (uploaded before it): the first chunks'
  // copies go out before the wait (pdl.cuh rule 1). Unfused, the new row comes from the kernel
  // before: its table entries go toward L1 now, the copies after the wait.
  if constexpr (kFused) {
    prologue();
  } else if (kb < ke) {
    for (int64_t b = kb / bs + tid; b <= (ke - 1) / bs; b += kThreads) PrefetchL1(slots.table + b);
  }
  PdlWait();
  PdlTrigger();
  // Fused: every split of the cluster takes part in the merge, an empty one with nothing (its
  // prologue only commits empty groups).
  if constexpr (!kFused) {
    if (kb >= ke) return MarkEmptySplit(p, split, t, g, group, sp, splits, tid);
    prologue();
  }
  if constexpr (kFused) __syncthreads();  // the angles

  // Q rows (the group's heads), zero past the group and past head_dim. Fused: this warp's first
  // two rows are loaded before the new row's key and value, so that the two round trips overlap.
  const uint16_t* q = static_cast<const uint16_t*>(p.q) + t * (p.q_stride ? p.q_stride : H * hd) + g * group * hd;
  constexpr int kWarpsN = kThreads / 32;
  float xq[2][kQkMaxPer] = {};
  if constexpr (kFused) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (warp + h * kWarpsN < group) QkLoadHead(q + (warp + h * kWarpsN) * hd, per, lane, xq[h]);
    }
  }
  if constexpr (kFused) {
    if (warp == 0 && new_row) {
      using Act = uint16_t;
      QkLoadHead(static_cast<const Act*>(qp.k) + (t * nkv + g) * hd, per, lane, kx);
      QkLoadHead(static_cast<const Act*>(qp.v) + (t * nkv + g) * hd, per, lane, vx);
      if (qp.k_norm) QkNorm(kx, per, lane, qp.k_norm, hd, qp.eps);
      if (qp.rope) QkRope(kx, per, lane, angles, hd / 2);
      const int64_t row = static_cast<int64_t>(qp.slots[t]) * nkv + g;
      QkStoreKv<E>(p.cache.k, p.cache.k_scale, row * hd, row, per, lane, kx);
      QkStoreKv<E>(p.cache.v, p.cache.v_scale, row * hd, row, per, lane, vx);
      if (new_chunk < kStages - 1) put_row(static_cast<int>(new_chunk));  // else when its chunk is issued
    }
  }
  MOESHARD_PROBE_MARK(0);  // the first chunks' copies issued, the new row written
  auto to_q = [](uint16_t v) {
    if constexpr (F16) {
      const __half h = __float2half_rn(DevBf16ToF32(v));
      v = *reinterpret_cast<const uint16_t*>(&h);
    }
    return v;
  };
  if constexpr (kFused) {  // normed and rotated here, rounded to bf16 as QkPrep stores them
    for (int r0 = warp; r0 < kRows; r0 += 2 * kWarpsN) {  // a warp's two rows loaded together
      float x[2][kQkMaxPer];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int j = 0; j < kQkMaxPer; ++j) x[h][j] = xq[h][j];  // the first two, loaded above
        if (r0 != warp && r0 + h * kWarpsN < group) QkLoadHead(q + (r0 + h * kWarpsN) * hd, per, lane, x[h]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + h * kWarpsN;
        if (r < group) {
          if (qp.q_norm) QkNorm(x[h], per, lane, qp.q_norm, hd, qp.eps);
          if (qp.rope) QkRope(x[h], per, lane, angles, hd / 2);
        }
#pragma unroll
        for (int j = 0; j < HD / 32; ++j) {
          const bool ok = r < group && j < per;
          Qs[r * LD + lane + 32 * j] = ok ? to_q(DevF32ToBf16(x[h][j])) : uint16_t{0};
        }
      }
    }
  } else {
    for (int i = tid; i < kRows * HD; i += kThreads) {
      const int r = i / HD, d = i % HD;
      Qs[r * LD + d] = r < group && d < hd ? to_q(q[r * hd + d]) : uint16_t{0};
    }
  }
  __syncthreads();
  MOESHARD_PROBE_MARK(1);  // Q staged
  uint32_t qa[KS][4];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) LdMatrixX4(Qs + (lane % 16) * LD + ks * 16 + (lane / 16) * 8, qa[ks]);

  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // rows lane / 4 and lane / 4 + 8

  for (int64_t c = 0; c < nchunks; ++c) {
    CpWait<kStages - 2>();
    __syncthreads();  // stage c visible; every warp done with stage c - 1
    if (c + kStages - 1 < nchunks) {
      issue(kb + (c + kStages - 1) * kChunk, static_cast<int>((c + kStages - 1) % kStages));
      if (kFused && warp == 0 && new_row && new_chunk == c + kStages - 1) {
        put_row(static_cast<int>((c + kStages - 1) % kStages));
      }
    } else {
      CpCommit();
    }
    const uint8_t* st = ring + (c % kStages) * G::kRawStage;
    const int kw = warp * 16;  // this warp's 16 keys of the stage
    const uint16_t* ks;
    const float *kscale = nullptr, *vscale = nullptr;
    if constexpr (E == KvElem::kBF16) {
      ks = reinterpret_cast<const uint16_t*>(st);
    } else {
      kscale = reinterpret_cast<const float*>(st + 2 * kChunk * HD);
      vscale = kscale + kChunk;
      Fp8RowsToF16<HD, LD>(st, kw, lane, work);  // K; V after the scores, into the same rows
      ks = work;
    }
    const uint16_t* vs = ks + kChunk * LD;  // FP8: `work` again, below

    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int k = 0; k < KS; ++k) {
      uint32_t b[4];
      LdMatrixX4(ks + (kw + lane % 8 + (lane / 16) * 8) * LD + k * 16 + ((lane / 8) % 2) * 8, b);
      Mma<F16>(s[0], qa[k], b[0], b[1]);
      Mma<F16>(s[1], qa[k], b[2], b[3]);
    }
    const int64_t key0 = kb + c * kChunk + kw + 2 * (lane % 4);
    float mx[2];
    ScaleMaskScores<F16>(s, key0, kb, ke, p.scale, kscale == nullptr ? nullptr : kscale + kw, lane, mx);
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], QuadMax(mx[r]));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      corr[r] = expf(m[r] - m_use);
      m[r] = m_new;
      mx[r] = m_use;
    }
    float sum[2];
    uint32_t pa[4];
    ScoresToP<F16>(s, mx, vscale == nullptr ? nullptr : vscale + kw, lane, sum, pa);  // F16: V's scale in P only
    l[0] = l[0] * corr[0] + sum[0];
    l[1] = l[1] * corr[1] + sum[1];
    if constexpr (E != KvElem::kBF16) {
      Fp8RowsToF16<HD, LD>(st + kChunk * HD, kw, lane, work);
      vs = work;
    }
    RescaleO<HD>(o, corr);
    PvMma<HD, F16>(o, pa, vs + kw * LD, LD, lane);
  }
  CpWait<0>();
  __syncthreads();  // the ring is reused for the merge
  MOESHARD_PROBE_MARK(2);  // every chunk's scores and values done

  float* Po = reinterpret_cast<float*>(smem + G::kPartial);  // fused: [row][HD], then m, l per row
  MergeTcWarps<HD, kFused>(p, split, t, g, group, sp, splits, smem, Po, o, m, l);
  if constexpr (kFused) {
    // The cluster's splits merge: split `sp` finishes outputs sp * kThreads + tid, ... reading
    // every split's partial from its shared memory (as CombineKernel merges the workspace's).
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every partial written
    // Every split's (O, m, l) of the element is read before any is used: one round trip of
    // distributed shared memory, not one per split.
    for (int i = static_cast<int>(sp) * kThreads + tid; i < group * HD; i += kFusedSplits * kThreads) {
      const int r = i / HD, d = i % HD;
      if (d >= hd) continue;
      float ms[kFusedSplits], ls[kFusedSplits], os[kFusedSplits];
#pragma unroll
      for (int s2 = 0; s2 < kFusedSplits; ++s2) {
        const float* po = cluster.map_shared_rank(Po, s2);
        ms[s2] = po[kRows * HD + r];
        ls[s2] = po[kRows * HD + kRows + r];
        os[s2] = po[r * HD + d];
      }
      float M = -INFINITY;
#pragma unroll
      for (int s2 = 0; s2 < kFusedSplits; ++s2) M = fmaxf(M, ls[s2] > 0.f ? ms[s2] : -INFINITY);
      float acc = 0.f, L = 0.f;
#pragma unroll
      for (int s2 = 0; s2 < kFusedSplits; ++s2) {
        if (ls[s2] > 0.f) {
          const float f = expf(ms[s2] - M);
          acc = fmaf(os[s2], f, acc);
          L = fmaf(ls[s2], f, L);
        }
      }
      uint16_t* out = static_cast<uint16_t*>(p.out) + t * (p.out_stride ? p.out_stride : H * hd) + (g * group + r) * hd;
      StoreF(out + d, L > 0.f ? acc / L : 0.f);
    }
    cluster.sync();  // no split leaves while another reads its shared memory
  }
  MOESHARD_PROBE_MARK(3);  // merged and stored
}

template <int HD, KvElem E, bool kFused>
__global__ void __launch_bounds__(kThreads) DecodeTcKernel(AttentionParams p, int group, int splits, float* ws,
                                                           QkPrepParams qp) {
  DecodeTc<HD, E, kFused>(p, group, splits, ws, qp);
}
// FP8 unfused: three CTAs an SM (at most 168 registers; its shared memory allows it, bf16's ring
// does not), more warps to hide each one's dependent chain.
template <int HD>
__global__ void __launch_bounds__(kThreads, 3) DecodeTcFp8Kernel(AttentionParams p, int group, int splits, float* ws) {
  DecodeTc<HD, KvElem::kFp8E4M3, false>(p, group, splits, ws, QkPrepParams{});
}

template <int HD, KvElem E>
cudaError_t LaunchTcHd(const AttentionParams& p, int splits, cudaStream_t st) {
  const int group = static_cast<int>(p.num_heads / p.cache.num_kv_heads);
  float* ws = splits > 1 ? static_cast<float*>(p.workspace) : nullptr;
  dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.cache.num_kv_heads),
            static_cast<unsigned>(p.num_tokens));
  static std::atomic<uint64_t> smem_set{0};
  if constexpr (E == KvElem::kFp8E4M3) {
    auto* k = &DecodeTcFp8Kernel<HD>;
    if (cudaError_t e = EnsureDynamicSmem(k, TcGeo<HD, E>::kSmem, smem_set); e != cudaSuccess) return e;
    return LaunchPdl(k, grid, kThreads, TcGeo<HD, E>::kSmem, st, p, group, splits, ws);
  } else {
    auto* k = &DecodeTcKernel<HD, E, false>;
    if (cudaError_t e = EnsureDynamicSmem(k, TcGeo<HD, E>::kSmem, smem_set); e != cudaSuccess) return e;
    return LaunchPdl(k, grid, kThreads, TcGeo<HD, E>::kSmem, st, p, group, splits, ws, QkPrepParams{});
  }
}

// Resident CTAs an SM of the split kernel LaunchTcHd takes for this head size and cache type.
template <int HD, KvElem E>
cudaError_t TcOccupancy(int* n) {
  static std::atomic<uint64_t> smem_set{0};
  if constexpr (E == KvElem::kFp8E4M3) {
    auto* k = &DecodeTcFp8Kernel<HD>;
    if (cudaError_t e = EnsureDynamicSmem(k, TcGeo<HD, E>::kSmem, smem_set); e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, k, kThreads, TcGeo<HD, E>::kSmem);
  } else {
    auto* k = &DecodeTcKernel<HD, E, false>;
    if (cudaError_t e = EnsureDynamicSmem(k, TcGeo<HD, E>::kSmem, smem_set); e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, k, kThreads, TcGeo<HD, E>::kSmem);
  }
}

// kFusedSplits splits a (token, KV head), one cluster; programmatic dependent launch as LaunchPdl.
template <int HD, KvElem E>
cudaError_t LaunchFusedHd(const AttentionParams& p, const QkPrepParams& qp, cudaStream_t st) {
  const int group = static_cast<int>(p.num_heads / p.cache.num_kv_heads);
  auto* k = &DecodeTcKernel<HD, E, true>;
  constexpr size_t smem = TcGeo<HD, E>::kFusedSmem;
  static std::atomic<uint64_t> smem_set{0};
  if (cudaError_t e = EnsureDynamicSmem(k, smem, smem_set); e != cudaSuccess) return e;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = PdlEnabled() ? 1 : 0;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = kFusedSplits;
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(kFusedSplits, static_cast<unsigned>(p.cache.num_kv_heads), static_cast<unsigned>(p.num_tokens));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  return cudaLaunchKernelEx(&cfg, k, p, group, static_cast<int>(kFusedSplits), static_cast<float*>(nullptr), qp);
}

}  // namespace

bool DecodeTcSupports(const AttentionParams& p) {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_ATTN_TC_DECODE");
    return !(v && v[0] == '0');
  }();
  const int64_t hd = p.cache.head_dim, nkv = p.cache.num_kv_heads;
  const bool elem_ok = p.cache.elem == KvElem::kBF16 ||
                       (p.cache.elem == KvElem::kFp8E4M3 && p.cache.k_scale != nullptr && p.cache.v_scale != nullptr);
  return on && p.dtype == ActDType::kBF16 && elem_ok && hd > 0 && hd <= 128 && hd % 16 == 0 && nkv > 0 &&
         p.num_heads % nkv == 0 && p.num_heads / nkv <= kRows &&
         reinterpret_cast<uintptr_t>(p.cache.k) % 16 == 0 && reinterpret_cast<uintptr_t>(p.cache.v) % 16 == 0;
}

int DecodeTcCtasPerSm(const AttentionParams& p) {
  if (DecodeSplitSupports(p)) return DecodeSplitCtasPerSm(p);  // the kernel LaunchAttentionDecodeTc takes
  static std::atomic<int> cached[4];
  return CachedCtasPerSm(cached, p.cache.head_dim <= 64, p.cache.elem == KvElem::kFp8E4M3, [](bool hd64, bool fp8, int* n) {
    if (hd64) return fp8 ? TcOccupancy<64, KvElem::kFp8E4M3>(n) : TcOccupancy<64, KvElem::kBF16>(n);
    return fp8 ? TcOccupancy<128, KvElem::kFp8E4M3>(n) : TcOccupancy<128, KvElem::kBF16>(n);
  });
}

cudaError_t LaunchAttentionDecodeTc(const AttentionParams& p, int64_t splits, cudaStream_t st) {
  if (DecodeSplitSupports(p)) return LaunchAttentionDecodeSplit(p, splits, st);  // attention_decode_split.cu
  const int s = static_cast<int>(splits);
  const bool fp8 = p.cache.elem == KvElem::kFp8E4M3;
  if (p.cache.head_dim <= 64) return fp8 ? LaunchTcHd<64, KvElem::kFp8E4M3>(p, s, st) : LaunchTcHd<64, KvElem::kBF16>(p, s, st);
  return fp8 ? LaunchTcHd<128, KvElem::kFp8E4M3>(p, s, st) : LaunchTcHd<128, KvElem::kBF16>(p, s, st);
}

bool DecodeFusedSupports(const AttentionParams& p, const QkPrepParams& qp) {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_ATTN_FUSED_DECODE");
    return !(v && v[0] == '0');
  }();
  static const bool clusters = DeviceIsSm90OrNewer();
  const int64_t hd = p.cache.head_dim;
  return on && clusters && DecodeTcSupports(p) && (hd == 64 || hd == 128) && p.max_tokens_per_seq == 1 &&
         p.window >= 0 && qp.dtype == ActDType::kBF16 && qp.k && qp.v && qp.slots && (!qp.rope || qp.pos) &&
         (qp.q_norm == nullptr) == (qp.k_norm == nullptr) && qp.cache.k == p.cache.k && qp.cache.v == p.cache.v &&
         p.q == qp.q;
}

cudaError_t LaunchAttentionDecodeFused(const AttentionParams& p, const QkPrepParams& qp, cudaStream_t st) {
  const bool fp8 = p.cache.elem == KvElem::kFp8E4M3;
  if (p.cache.head_dim == 64) {
    return fp8 ? LaunchFusedHd<64, KvElem::kFp8E4M3>(p, qp, st) : LaunchFusedHd<64, KvElem::kBF16>(p, qp, st);
  }
  return fp8 ? LaunchFusedHd<128, KvElem::kFp8E4M3>(p, qp, st) : LaunchFusedHd<128, KvElem::kBF16>(p, qp, st);
}

}  // namespace moeshard::gpu
