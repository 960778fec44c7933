// The MXFP4 experts of bench/persistent_layer_bench: gate/up with SwiGLU and down with the weighted
// mix, as the layer's phases 4 and 5 inside the persistent launch, on tensor cores (m16n8k16 bf16,
// the production decode kernels' arithmetic: kernels/moe/moe_stream_direct.cuh ComputeChunk).
//
// Weights are in the streaming kernels' repacked e2m1 layout (kernels/moe/moe_stream_decode.h), one
// record a chunk: 16 rows x 256 columns, 2,048 code bytes then the chunk's 128 e8m0 scale bytes
// (2,176 bytes, one bulk copy). An expert's gate rows are 48 slices of 8 chunks, then its up rows;
// its down rows 128 slices of 3 chunks. The bench fills records with random bytes (codes) and scale
// bytes near 2^-10 (gate/up) and 2^-7 (down); the host reference decodes them with the same lane
// functions and the m16n8k16 fragment rules (MxRecordValue below).
//
// Each warp streams its own chunks through kMxSlots one-chunk slots (an mbarrier each):
//   gate/up: the block's units (pair, 16-row slice) in order; warp w takes the unit's gate (w < 4)
//            or up chunks 2 (w % 4), 2 (w % 4) + 1; one block barrier a unit adds the four partial
//            sums of each row in warp order and writes h = bf16(silu(bf16 gate) * bf16 up)
//   down:    block b owns rows 16b .. 16b + 15 (blocks past 128 none); warp w takes pairs w, w + 8
//            (one a token at two tokens), 3 chunks each, times the pair's routing weight; the warps'
//            sums are added in warp order.
// A warp's first down chunks go out when its gate/up chunks are done, before the wait on gate/up.
#pragma once

#include <cstdint>

#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/moe/moe_device.cuh"
#include "kernels/moe/moe_stream_decode.h"

namespace moeshard::bench::mx {

constexpr int kCols = 256, kData = 2048, kScale = 128, kRec = kData + kScale;
constexpr int kSlots = 4;       // a warp's one-chunk slots
constexpr int kWarps = 8;       // the persistent block's warps
constexpr int kGuChunks = 8;    // K = 2,048
constexpr int kDnChunks = 3;    // K = 768
constexpr int kGuSlices = 48;   // 768 rows
constexpr int kDnSlices = 128;  // 2,048 rows
constexpr int kRegion = kWarps * kSlots * kRec;
constexpr int kBars = kWarps * kSlots;

// Record index of gate (g = 0) or up (g = 1) slice s, chunk kc of expert e; of down slice s, chunk kc.
__host__ __device__ constexpr int64_t GuRecord(int e, int g, int s, int kc) {
  return ((int64_t{e} * 2 + g) * kGuSlices + s) * kGuChunks + kc;
}
__host__ __device__ constexpr int64_t DnRecord(int e, int s, int kc) {
  return (int64_t{e} * kDnSlices + s) * kDnChunks + kc;
}

// The weight at row r (0..15), column k (0..255) of a record, as a lane decodes it: word
// (q · 32 + lane) · 4 + wi holds row g + 8 (wi & 1), columns 64q + 16c + 8 (wi >> 1) .. + 7; slot i,
// half h of its DecodeRepacked is column + 2i + h (the fragment pairs a0/b0 .. a3/b1 of ComputeChunk).
inline float MxRecordValue(const uint8_t* rec, int r, int k) {
  const int q = k / 64, c = (k % 64) / 16, jw = (k % 16) / 8, i = (k % 8) / 2, h = k % 2;
  const int g = r % 8, wi = 2 * jw + r / 8, lane = 4 * g + c;
  uint32_t w, sc, s2[2], out[4];
  std::memcpy(&w, rec + ((q * 32 + lane) * 4 + wi) * 4, 4);
  std::memcpy(&sc, rec + kData + gpu::E2m1ScaleWord(lane, q, true), 4);
  gpu::E2m1ScalePair(sc, q, true, s2);
  gpu::DecodeRepacked(w, s2[r / 8], out);
  return lane::Bits(h == 0 ? out[i] << 16 : out[i] & 0xffff0000u);
}

#if defined(__CUDACC__)

// Random code bytes and scale bytes base .. base + 3 (records [0, n)).
static __global__ void FillMx(uint8_t* p, int64_t n, int base, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n * kRec; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    p[i] = i % kRec < kData ? static_cast<uint8_t>(x >> 8) : static_cast<uint8_t>(base + (x >> 8) % 4);
  }
}

// The record's product with 256 bf16 activations `x` (shared memory) added into acc (rows g, g + 8
// in acc[0] / acc[2]; every column of the n8 tile is the same token).
__device__ __forceinline__ void Chunk(const uint8_t* rec, const uint16_t* x, int lane, float (&acc)[4]) {
  const int c = lane & 3;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint4 wd = *reinterpret_cast<const uint4*>(rec + (q * 32 + lane) * 16);
    const uint32_t sc = *reinterpret_cast<const uint32_t*>(rec + kData + gpu::E2m1ScaleWord(lane, q, true));
    uint32_t s2[2];
    gpu::E2m1ScalePair(sc, q, true, s2);
    const uint4* bp = reinterpret_cast<const uint4*>(x + q * 64 + 16 * c);
    const uint4 bq[2] = {bp[0], bp[1]};
#pragma unroll
    for (int jw = 0; jw < 2; ++jw) {
      uint32_t ag[4], ag8[4];
      gpu::DecodeRepacked(jw == 0 ? wd.x : wd.z, s2[0], ag);
      gpu::DecodeRepacked(jw == 0 ? wd.y : wd.w, s2[1], ag8);
      gpu::MmaBf16(acc, ag[0], ag8[0], ag[1], ag8[1], bq[jw].x, bq[jw].y);
      gpu::MmaBf16(acc, ag[2], ag8[2], ag[3], ag8[3], bq[jw].z, bq[jw].w);
    }
  }
}

// A warp's stream of chunks through its slots: item i in slot i % kSlots. Lane 0 issues; every
// lane waits. `uses`: completed waits a slot (the same in every lane of the warp).
struct WarpRing {
  uint8_t* slots;  // the warp's kSlots records
  uint64_t* bars;  // the warp's kSlots barriers
  uint32_t* uses;  // [kSlots], the thread's registers
  __device__ __forceinline__ void Issue(int i, const uint8_t* src, int lane) const {
    if (lane != 0) return;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    gpu::MbarrierArriveExpectTx(&bars[i % kSlots], kRec);
    gpu::BulkCopyToShared(slots + (i % kSlots) * kRec, src, kRec, &bars[i % kSlots]);
  }
  __device__ __forceinline__ const uint8_t* Wait(int i) const {
    const int st = i % kSlots;
    gpu::MbarrierWait(&bars[st], uses[st] & 1);
    ++uses[st];
    return slots + st * kRec;
  }
};

// Phase 4, MXFP4: units [u0, u1) of the layer's T x 8 x 48 (pair, slice) units. xb: the T tokens'
// bf16 activations [T][2048] (shared); sel: the pairs' experts; part: [2][8][16] floats (shared);
// h: the pairs' bf16 outputs [T x 8][768].
__device__ inline void GateUp(const uint8_t* gu, const uint16_t* xb, const int* sel, int u0, int u1, WarpRing ring,
                              float* part, uint16_t* h) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = warp / 4, kc0 = 2 * (warp % 4);
  const int n = 2 * (u1 - u0);
  auto src = [&](int i) {
    const int u = u0 + i / 2;
    return gu + GuRecord(sel[u / kGuSlices], g, u % kGuSlices, kc0 + i % 2) * kRec;
  };
  for (int i = 0; i < min(kSlots, n); ++i) ring.Issue(i, src(i), lane);
  for (int k = 0; k < u1 - u0; ++k) {
    const int u = u0 + k, t = u / kGuSlices / 8;
    float acc[4] = {};
    for (int i = 2 * k; i < 2 * k + 2; ++i) {
      const uint8_t* rec = ring.Wait(i);
      Chunk(rec, xb + t * 2048 + (kc0 + i % 2) * kCols, lane, acc);
      __syncwarp();
      if (i + kSlots < n) ring.Issue(i + kSlots, src(i + kSlots), lane);
    }
    float* pk = part + (k % 2) * kWarps * 16 + warp * 16;
    if ((lane & 3) == 0) {
      pk[lane / 4] = acc[0];
      pk[lane / 4 + 8] = acc[2];
    }
    __syncthreads();
    if (threadIdx.x < 16) {
      const float* p = part + (k % 2) * kWarps * 16 + threadIdx.x;
      const float gate = ((p[0] + p[16]) + p[32]) + p[48], up = ((p[64] + p[80]) + p[96]) + p[112];
      h[(u / kGuSlices) * 768 + (u % kGuSlices) * 16 + threadIdx.x] =
          gpu::DevF32ToBf16(gpu::Silu(gpu::RoundBf16(gate)) * gpu::RoundBf16(up));
    }
  }
}

// Phase 5's first chunks, before the wait on gate/up: they depend only on the routing.
__device__ inline const uint8_t* DownSrc(const uint8_t* dn, const int* sel, int slice, int i) {
  const int warp = threadIdx.x / 32;
  return dn + DnRecord(sel[warp + kWarps * (i / kDnChunks)], slice, i % kDnChunks) * kRec;
}
template <int T>
__device__ inline void DownIssueFirst(const uint8_t* dn, const int* sel, int slice, WarpRing ring) {
  if (slice >= kDnSlices) return;
  for (int i = 0; i < min(kSlots, T * kDnChunks); ++i) ring.Issue(i, DownSrc(dn, sel, slice, i), threadIdx.x % 32);
}

// Phase 5, MXFP4: the block's 16 rows of every pair (hb: the pairs' bf16 h [T x 8][768], shared),
// weighted by wt and added in warp order into mix[t][16] (shared; part: [8][T][16] floats, shared).
template <int T>
__device__ inline void Down(const uint8_t* dn, const uint16_t* hb, const int* sel, const float* wt, int slice,
                            WarpRing ring, float* part, float* mix) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n = T * kDnChunks;
  if (slice < kDnSlices) {
    for (int t = 0; t < T; ++t) {
      const int j = warp + kWarps * t;
      float acc[4] = {};
      for (int i = kDnChunks * t; i < kDnChunks * (t + 1); ++i) {
        const uint8_t* rec = ring.Wait(i);
        Chunk(rec, hb + j * 768 + (i % kDnChunks) * kCols, lane, acc);
        __syncwarp();
        if (i + kSlots < n) ring.Issue(i + kSlots, DownSrc(dn, sel, slice, i + kSlots), lane);
      }
      if ((lane & 3) == 0) {
        part[(warp * T + t) * 16 + lane / 4] = wt[j] * acc[0];
        part[(warp * T + t) * 16 + lane / 4 + 8] = wt[j] * acc[2];
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < T * 16) {
    const int t = threadIdx.x / 16, r = threadIdx.x % 16;
    float s = 0.f;
    for (int w = 0; w < kWarps; ++w) s += part[(w * T + t) * 16 + r];
    mix[t * 16 + r] = s;
  }
  __syncthreads();
}

#endif  // __CUDACC__

}  // namespace moeshard::bench::mx
