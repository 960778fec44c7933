// Split-K decode attention for a bf16 KV cache that streams K/V with cp.async: the same
// split of each token's visible keys into ranges as attention_decode.cu (and the same
// workspace layout, so its combine kernel merges the partials), but a CTA copies its keys
// 64 at a time, raw bf16, into a two-slot shared-memory ring (the next chunk's copies are
// in flight while the current one is scored), instead of converting each tile to fp32
// through registers between barriers. Rows are padded to HD + 8 elements (272 bytes at
// HD = 128), so lanes reading different keys' rows hit different bank groups.
//
// One CTA of 4 warps per (split, KV head, token); warp w owns GQA heads w, w + 4, ... of the
// KV head; lane i scores keys i and i + 32 of a chunk, the probabilities go through shared
// memory, and lane i accumulates output dims [i * HD / 32, (i + 1) * HD / 32). Keys past
// the range are zero-filled and masked. fp32 scores, softmax and accumulation.
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/pdl.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kThreads = 128, kChunk = 64, kHpw = 4, kMaxGroup = 4 * kHpw;

template <int HD>
struct Geo {
  static constexpr int kLd = HD + 8;                       // bf16 elements per padded row
  static constexpr int kPieces = HD * 2 / 16;              // 16-byte copies per key row
  static constexpr int kKvBytes = 2 * kChunk * kLd * 2;    // K and V of one chunk
  static constexpr size_t kSmem = size_t{kMaxGroup} * HD * 4 + 2 * kKvBytes + size_t{kMaxGroup} * kChunk * 4;
};

template <typename Act, int HD>
__global__ void __launch_bounds__(kThreads) DecodeAsyncKernel(AttentionParams p, int group, int splits, float* ws) {
  using G = Geo<HD>;
  constexpr int VEC = HD / 32;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);
  uint16_t* ring = reinterpret_cast<uint16_t*>(Qs + kMaxGroup * HD);  // [2][K chunk | V chunk]
  float* Ps = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(ring) + 2 * G::kKvBytes);
  PdlWait();
  PdlTrigger();

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t t = blockIdx.z, g = blockIdx.y, sp = blockIdx.x;
  const int64_t nkv = p.cache.num_kv_heads, bs = p.cache.block_size, H = p.num_heads, hd = HD;
  const DecodeSplit split = DecodeSplitOf(p, t, sp, splits, ws);
  const int64_t kb = split.kb, ke = split.ke;
  if (kb >= ke) return MarkEmptySplit(p, split, t, g, group, sp, splits, tid);
  const int32_t* table = p.block_tables + p.table_offset[t];
  const PagedSlots slots(table, bs);
  const uint16_t* kc = static_cast<const uint16_t*>(p.cache.k);
  const uint16_t* vc = static_cast<const uint16_t*>(p.cache.v);
  auto issue = [&](int64_t c0, int slot) {
    uint16_t* ks = ring + slot * (G::kKvBytes / 2);
    uint16_t* vs = ks + kChunk * G::kLd;
    for (int i = tid; i < kChunk * G::kPieces; i += kThreads) {
      const int key = i / G::kPieces, piece = i % G::kPieces;
      const int64_t kp = c0 + key;
      const bool valid = kp < ke;
      const int64_t row = valid ? (slots(kp) * nkv + g) * hd : 0;
      CpAsync16(ks + key * G::kLd + piece * 8, kc + row + piece * 8, valid);
      CpAsync16(vs + key * G::kLd + piece * 8, vc + row + piece * 8, valid);
    }
    CpCommit();
  };
  const int64_t nchunks = (ke - kb + kChunk - 1) / kChunk;
  issue(kb, 0);
  const Act* q = static_cast<const Act*>(p.q) + t * (p.q_stride ? p.q_stride : H * hd) + g * group * hd;
  for (int i = tid; i < group * HD; i += kThreads) Qs[i] = LoadF(q + i) * p.scale;

  float m[kHpw], l[kHpw], acc[kHpw][VEC];
#pragma unroll
  for (int j = 0; j < kHpw; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.f;
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[j][e] = 0.f;
  }
  for (int64_t c = 0; c < nchunks; ++c) {
    if (c + 1 < nchunks) {
      issue(kb + (c + 1) * kChunk, static_cast<int>((c + 1) & 1));
      CpWait<1>();
    } else {
      CpWait<0>();
    }
    __syncthreads();  // chunk c (and Q) visible to every warp
    const uint16_t* ks = ring + (c & 1) * (G::kKvBytes / 2);
    const uint16_t* vs = ks + kChunk * G::kLd;
    const int64_t c0 = kb + c * kChunk;
#pragma unroll
    for (int j = 0; j < kHpw; ++j) {
      const int hh = warp + 4 * j;
      if (hh >= group) continue;  // uniform in the warp
      const float* qh = Qs + hh * HD;
      float s[2] = {0.f, 0.f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const uint16_t* kr = ks + (lane + 32 * r) * G::kLd;
#pragma unroll 4
        for (int d = 0; d < HD; d += 8) {
          const uint4 u = *reinterpret_cast<const uint4*>(kr + d);
          const float4 qa = *reinterpret_cast<const float4*>(qh + d);
          const float4 qb = *reinterpret_cast<const float4*>(qh + d + 4);
          s[r] = fmaf(qa.x, __uint_as_float(u.x << 16), s[r]);
          s[r] = fmaf(qa.y, __uint_as_float(u.x & 0xffff0000u), s[r]);
          s[r] = fmaf(qa.z, __uint_as_float(u.y << 16), s[r]);
          s[r] = fmaf(qa.w, __uint_as_float(u.y & 0xffff0000u), s[r]);
          s[r] = fmaf(qb.x, __uint_as_float(u.z << 16), s[r]);
          s[r] = fmaf(qb.y, __uint_as_float(u.z & 0xffff0000u), s[r]);
          s[r] = fmaf(qb.z, __uint_as_float(u.w << 16), s[r]);
          s[r] = fmaf(qb.w, __uint_as_float(u.w & 0xffff0000u), s[r]);
        }
        if (c0 + lane + 32 * r >= ke) s[r] = -INFINITY;
      }
      const float m_new = fmaxf(m[j], WarpMax(fmaxf(s[0], s[1])));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float corr = expf(m[j] - m_use);
      const float p0 = expf(s[0] - m_use), p1 = expf(s[1] - m_use);
      l[j] = l[j] * corr + WarpSum(p0 + p1);
      m[j] = m_new;
      float* ph = Ps + hh * kChunk;
      ph[lane] = p0;
      ph[lane + 32] = p1;
      __syncwarp();
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[j][e] *= corr;
#pragma unroll 4
      for (int k = 0; k < kChunk; ++k) {
        const float pk = ph[k];
        const uint16_t* vr = vs + k * G::kLd + lane * VEC;
        if constexpr (VEC == 4) {
          const uint2 u = *reinterpret_cast<const uint2*>(vr);
          acc[j][0] = fmaf(pk, __uint_as_float(u.x << 16), acc[j][0]);
          acc[j][1] = fmaf(pk, __uint_as_float(u.x & 0xffff0000u), acc[j][1]);
          acc[j][2] = fmaf(pk, __uint_as_float(u.y << 16), acc[j][2]);
          acc[j][3] = fmaf(pk, __uint_as_float(u.y & 0xffff0000u), acc[j][3]);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[j][e] = fmaf(pk, DevBf16ToF32(vr[e]), acc[j][e]);
        }
      }
      __syncwarp();  // Ps of this head is rewritten by the next chunk
    }
    __syncthreads();  // every warp done with this slot before it is refilled
  }
#pragma unroll
  for (int j = 0; j < kHpw; ++j) {
    const int hh = warp + 4 * j;
    if (hh < group) StoreDecodeHead<Act, VEC>(p, split, t, g * group + hh, sp, splits, lane, acc[j], m[j], l[j]);
  }
}

template <typename Act, int HD>
cudaError_t LaunchHd(const AttentionParams& p, int splits, cudaStream_t st) {
  const int group = static_cast<int>(p.num_heads / p.cache.num_kv_heads);
  auto* k = &DecodeAsyncKernel<Act, HD>;
  static std::atomic<uint64_t> smem_set{0};
  if (cudaError_t e = EnsureDynamicSmem(k, Geo<HD>::kSmem, smem_set); e != cudaSuccess) return e;
  float* ws = splits > 1 ? static_cast<float*>(p.workspace) : nullptr;
  dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(p.cache.num_kv_heads),
            static_cast<unsigned>(p.num_tokens));
  return LaunchPdl(k, grid, kThreads, Geo<HD>::kSmem, st, p, group, splits, ws);
}

}  // namespace

bool DecodeAsyncSupports(const AttentionParams& p) {
  const int64_t hd = p.cache.head_dim;
  return p.cache.elem == KvElem::kBF16 && (hd == 64 || hd == 128) &&
         p.num_heads / p.cache.num_kv_heads <= kMaxGroup &&
         reinterpret_cast<uintptr_t>(p.cache.k) % 16 == 0 && reinterpret_cast<uintptr_t>(p.cache.v) % 16 == 0;
}

cudaError_t LaunchAttentionDecodeAsync(const AttentionParams& p, int64_t splits, cudaStream_t st) {
  const int s = static_cast<int>(splits);
  const bool f32 = p.dtype == ActDType::kF32;
  if (p.cache.head_dim == 64) return f32 ? LaunchHd<float, 64>(p, s, st) : LaunchHd<uint16_t, 64>(p, s, st);
  return f32 ? LaunchHd<float, 128>(p, s, st) : LaunchHd<uint16_t, 128>(p, s, st);
}

}  // namespace moeshard::gpu
