// persistent_layer_bench: a Qwen3-30B decode layer without its attention — Q/K/V, O, the router,
// the top-8 routing, the experts' gate/up with SwiGLU and their down with the weighted combine and
// the residual update — as one persistent launch (issue 13; kernels/cuda/DECODE_MEGAKERNEL.md, step
// 2 of its order of work). Every matrix is split Q8 (the Q8_0 variant of the issue's GGUF: 128
// experts of 2 x 768 gate/up rows and 2,048 down rows a layer, ~0.64 GB a layer), every layer its own
// weights, so they stream from DRAM as in a step; the experts also as MXFP4 (the issue's GGUF's
// format: persistent_layer_mx.cuh, tensor cores on the production kernels' repacked layout, ~0.32 GB a
// layer), each format a row of the table. One block an SM, phases apart by counter barriers
// (bench/persistent_common.cuh):
//
//   1. Q/K/V: each block normalizes s (every block itself), then its share of W_qkv's rows
//   2. O on Q/K/V's first 4,096 outputs: its share of W_o's rows
//   3. router: each block forms rmsnorm(s + O's output) itself (gate/up needs it too), its router rows
//   4. gate/up: each block routes every token itself (top-8 of the 128 logits, softmax over the 8),
//      then streams its share of the (pair, row) units of the chosen experts' gate and up rows
//      through a ring and writes h = silu(gate) * up
//   5. down: each block owns ~16 output rows of every pair's down matrix, streams them through a ring,
//      adds the pairs' products in a fixed order with their routing weights, and writes the next
//      layer's s = s + O's output + the experts' mix
//
// Dense rows are requested a phase ahead (as `persistent_chain_bench`'s "a phase ahead"; O's buffer
// doubles as the experts' rings), the experts' rows once the block has routed. Printed: µs a layer
// (median of --iters runs of the L-layer chain / L), the bytes a layer read (dense rows + the T x 8
// pairs' expert rows, a pair's counted once each) over the copy rate measured in the same run.
// First a run of --check-layers layers is checked against a host reference of the same arithmetic
// (the next layers' residual s: relative 1e-2 of its increment; exit 1 otherwise; ctest
// persistent_layer_check, label gpu; exit 77 without a device).
//
//   persistent_layer_bench [--layers 48] [--tokens 1,2] [--iters 20] [--check-layers 2]
//                          [--experts q8_0|mxfp4|both]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "bench/copy_rate.h"
#include "bench/cuda_exit.h"
#include "bench/persistent_common.cuh"
#include "bench/persistent_layer_mx.cuh"
#include "kernels/cuda/mbarrier.cuh"

namespace moeshard::bench {
namespace {

using gpu::BulkCopyToShared;
using gpu::MbarrierArriveExpectTx;
using gpu::MbarrierInit;
using gpu::MbarrierWait;

constexpr int kD = 2048, kN1 = 5120, kK2 = 4096, kE = 128, kTopK = 8, kI = 768;
constexpr int kThreads = kPersistThreads;
constexpr int kPhases = 5;
constexpr uint32_t kCopyPiece = 16384;
constexpr int kGuChunk = 8;    // row pairs (gate row q, up row kI + q) a gate/up ring stage
constexpr int kDownRows = 16;  // the most down rows a block owns (2,048 / SMs, 128 SMs or more)
constexpr int kRing = 4;       // ring stages (gate/up takes 2 of them: theirs are twice the size)

struct Layer {
  const int8_t* w[3];  // Q/K/V [kN1, kD], O [kD, kK2], router [kE, kD]
  const uint16_t* sc[3];
  const int8_t* gu;  // [kE][2 kI][kD]: gate rows, then up rows
  const uint16_t* gu_sc;
  const int8_t* dn;  // [kE][kD][kI]
  const uint16_t* dn_sc;
  const uint8_t* gu_mx;  // MXFP4 records (persistent_layer_mx.cuh), or null
  const uint8_t* dn_mx;
};

struct LayerArgs {
  const Layer* layers;
  int L, T;
  float* s;            // [L + 1][T][kD]: s[0] given, s[l + 1] by layer l's down phase
  const float* norm;   // [kD]
  uint16_t* y1;        // [L][T][kN1] bf16
  float* y2;           // [L][T][kD]
  float* y3;           // [L][T][kE]
  float* h;            // [L][T kTopK][kI] (MXFP4: bf16)
  unsigned* counters;  // [L][kPhases], zero before the launch
};

__host__ __device__ constexpr int Rows(int p) { return p == 0 ? kN1 : p == 1 ? kD : kE; }
__host__ __device__ constexpr int Cols(int p) { return p == 1 ? kK2 : kD; }
__host__ __device__ inline int RowBegin(int rows, int b, int nb) { return static_cast<int>(int64_t{rows} * b / nb); }
constexpr size_t kGuStage = 2 * kGuChunk * kD + 2 * kGuChunk * (kD / 32) * 2;
constexpr size_t kDnStage = kDownRows * kI + kDownRows * (kI / 32) * 2;

struct Smem {
  size_t codes[3], scales[3], ring, sel, wt, mix, part, bars, total;
};
constexpr int kBars = 3 + (kRing > mx::kBars ? kRing : mx::kBars);

Smem SmemFor(int nb, int T, bool mx_experts) {
  Smem s{};
  size_t off = static_cast<size_t>(T) * std::max(kK2, kTopK * kI) * sizeof(float);
  size_t region1 = 0;
  for (int p = 0; p < 3; ++p) {
    int m = 0;
    for (int b = 0; b < nb; ++b) m = std::max(m, RowBegin(Rows(p), b + 1, nb) - RowBegin(Rows(p), b, nb));
    const size_t bytes = static_cast<size_t>(m) * Cols(p) + static_cast<size_t>(m) * (Cols(p) / 32) * 2;
    if (p == 1) {  // O's rows and the experts' rings share one region
      region1 = mx_experts ? std::max(bytes, static_cast<size_t>(mx::kRegion))
                           : std::max({bytes, 2 * kGuStage, kRing * kDnStage});
      s.codes[1] = s.ring = off;
      s.scales[1] = off + static_cast<size_t>(m) * Cols(p);
      off += region1;
    } else {
      s.codes[p] = off;
      s.scales[p] = off + static_cast<size_t>(m) * Cols(p);
      off += bytes;
    }
    off = (off + 15) / 16 * 16;
  }
  s.sel = off;
  off += static_cast<size_t>(T) * kTopK * sizeof(int);
  s.wt = off;
  off += static_cast<size_t>(T) * kTopK * sizeof(float);
  s.mix = off;
  off += static_cast<size_t>(T) * kDownRows * sizeof(float);
  s.part = off;  // MXFP4's partial sums: [2][8][16] (gate/up), [8][T][16] (down)
  off += 2 * mx::kWarps * 16 * sizeof(float);
  s.bars = (off + 7) / 8 * 8;
  s.total = s.bars + kBars * sizeof(uint64_t);
  return s;
}

// The block's rows of dense matrix p of layer l into its buffer, counted on bars[p] (thread 0).
__device__ void IssueDense(const LayerArgs& a, const Smem& sm, unsigned char* base, int p, int l) {
  const int r0 = RowBegin(Rows(p), blockIdx.x, gridDim.x), r1 = RowBegin(Rows(p), blockIdx.x + 1, gridDim.x);
  if (r1 == r0 || l >= a.L) return;
  uint64_t* bar = reinterpret_cast<uint64_t*>(base + sm.bars) + p;
  const uint32_t cb = static_cast<uint32_t>(r1 - r0) * Cols(p),
                 sb = static_cast<uint32_t>(r1 - r0) * (Cols(p) / 32) * 2;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  MbarrierArriveExpectTx(bar, cb + sb);
  const Layer& ly = a.layers[l];
  const unsigned char* src = reinterpret_cast<const unsigned char*>(ly.w[p]) + static_cast<size_t>(r0) * Cols(p);
  for (uint32_t o = 0; o < cb; o += kCopyPiece)
    BulkCopyToShared(base + sm.codes[p] + o, src + o, min(kCopyPiece, cb - o), bar);
  BulkCopyToShared(base + sm.scales[p],
                   reinterpret_cast<const unsigned char*>(ly.sc[p]) + static_cast<size_t>(r0) * (Cols(p) / 32) * 2, sb,
                   bar);
}

// Gate/up chunk k of the block's range of row pairs [rp0, rp1): pair j, rows [q, q + n) of its expert.
struct GuChunk {
  int j, q, n;
};
__device__ inline int GuChunks(int rp0, int rp1) {
  int k = 0;
  for (int pos = rp0; pos < rp1; ++k) pos += min(kGuChunk, min(kI - pos % kI, rp1 - pos));
  return k;
}
__device__ inline GuChunk GuChunkAt(int rp0, int rp1, int k) {
  int pos = rp0;
  for (int i = 0; i < k; ++i) pos += min(kGuChunk, min(kI - pos % kI, rp1 - pos));
  return {pos / kI, pos % kI, min(kGuChunk, min(kI - pos % kI, rp1 - pos))};
}

template <int T, bool kMx>
__global__ void __launch_bounds__(kThreads, 1) PersistentLayer(LayerArgs a, Smem sm) {
  extern __shared__ __align__(128) unsigned char base[];
  float4* xs = reinterpret_cast<float4*>(base);
  int* sel = reinterpret_cast<int*>(base + sm.sel);
  float* wt = reinterpret_cast<float*>(base + sm.wt);
  float* mix = reinterpret_cast<float*>(base + sm.mix);
  float* part = reinterpret_cast<float*>(base + sm.part);
  uint64_t* bars = reinterpret_cast<uint64_t*>(base + sm.bars);
  uint64_t* ring = bars + 3;
  __shared__ float scratch[32];
  __shared__ float gate[kGuChunk], up[kGuChunk];
  const int nb = gridDim.x, b = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  int rb[3], nr[3];
  for (int p = 0; p < 3; ++p) {
    rb[p] = RowBegin(Rows(p), b, nb);
    nr[p] = RowBegin(Rows(p), b + 1, nb) - rb[p];
  }
  const int d0 = RowBegin(kD, b, nb), dn = RowBegin(kD, b + 1, nb) - d0;  // the block's down rows
  const int rp0 = RowBegin(T * kTopK * kI, b, nb), rp1 = RowBegin(T * kTopK * kI, b + 1, nb);
  if (tid == 0) {
    for (int i = 0; i < kBars; ++i) MbarrierInit(&bars[i], 1);
    gpu::FenceMbarrierInit();
  }
  __syncthreads();
  // Completed waits a ring stage (its next parity); the same in every thread.
  uint32_t uses[kRing > mx::kSlots ? kRing : mx::kSlots] = {};
  if (tid == 0) IssueDense(a, sm, base, 0, 0);
  for (int l = 0; l < a.L; ++l) {
    const uint32_t parity = l & 1;
    unsigned* cnt = a.counters + kPhases * l;
    const float* s = a.s + static_cast<size_t>(l) * T * kD;
    uint16_t* y1 = a.y1 + static_cast<size_t>(l) * T * kN1;
    float* y2 = a.y2 + static_cast<size_t>(l) * T * kD;
    float* y3 = a.y3 + static_cast<size_t>(l) * T * kE;
    float* h = a.h + static_cast<size_t>(l) * T * kTopK * kI;
    const Layer& ly = a.layers[l];
    // Dense matrix p's rows of this layer, once their copies have landed, into `store`.
    auto dense = [&](int p, auto store) {
      MbarrierWait(&bars[p], parity);
      ComputeRows<T>(reinterpret_cast<const int8_t*>(base + sm.codes[p]),
                     reinterpret_cast<const uint16_t*>(base + sm.scales[p]), nr[p], Cols(p), xs, store);
    };
    // 1. Q/K/V on bf16(rmsnorm(s)).
    if (l > 0) AwaitAll(cnt - 1);
    if (tid == 0) IssueDense(a, sm, base, 1, l);  // the ring's region: the down phase before is over
    for (int t = 0; t < T; ++t) NormInto(xs, t, kD, s, nullptr, a.norm, true, nullptr, scratch);
    __syncthreads();
    dense(0, [&](int t, int r, float v) { y1[t * kN1 + rb[0] + r] = gpu::DevF32ToBf16(v); });
    Arrive(cnt + 0);
    // 2. O.
    AwaitAll(cnt + 0);
    if (tid == 0) IssueDense(a, sm, base, 2, l);
    StageBf16(xs, y1, kN1, kK2, T);
    __syncthreads();
    dense(1, [&](int t, int r, float v) { y2[t * kD + rb[1] + r] = v; });
    Arrive(cnt + 1);
    // 3. Router on rmsnorm(s + O's output), which every block keeps in xs for gate/up.
    AwaitAll(cnt + 1);
    if (tid == 0) IssueDense(a, sm, base, 0, l + 1);
    for (int t = 0; t < T; ++t) NormInto(xs, t, kD, s, y2, a.norm, false, nullptr, scratch);
    __syncthreads();
    if (nr[2] > 0) dense(2, [&](int t, int r, float v) { y3[t * kE + rb[2] + r] = v; });
    Arrive(cnt + 2);
    // 4. Routing (every block, warp t token t), then gate/up through a two-stage ring.
    AwaitAll(cnt + 2);
    if (warp < T) {
      float v[kE / 32];
      for (int i = 0; i < kE / 32; ++i) v[i] = __ldcg(y3 + warp * kE + lane + 32 * i);
      float top = 0.f, sum = 0.f, got[kTopK];
      int idx[kTopK];
      for (int k = 0; k < kTopK; ++k) {
        float best = -INFINITY;
        int bi = kE;
        for (int i = 0; i < kE / 32; ++i)
          if (v[i] > best || (v[i] == best && lane + 32 * i < bi)) best = v[i], bi = lane + 32 * i;
        for (int o = 16; o > 0; o >>= 1) {
          const float ob = __shfl_xor_sync(0xffffffffu, best, o);
          const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
          if (ob > best || (ob == best && oi < bi)) best = ob, bi = oi;
        }
        if (k == 0) top = best;
        got[k] = expf(best - top);
        sum += got[k];
        idx[k] = bi;
        if (bi % 32 == lane) v[bi / 32] = -INFINITY;
      }
      if (lane < kTopK) {
        sel[warp * kTopK + lane] = idx[lane];
        wt[warp * kTopK + lane] = got[lane] / sum;
      }
    }
    __syncthreads();
    if constexpr (kMx) {
      // 4-5, MXFP4 (persistent_layer_mx.cuh): the activations as bf16 for the tensor cores.
      uint16_t* xb = reinterpret_cast<uint16_t*>(base + static_cast<size_t>(T) * kD * sizeof(float));
      for (int i = tid; i < T * kD; i += kThreads) {
        const int t = i / kD, k = i % kD;
        const float4 v = xs[t * (kD / 4) + XsSlot(k / 16, (k / 4) % 4)];
        xb[i] = gpu::DevF32ToBf16(k % 4 == 0 ? v.x : k % 4 == 1 ? v.y : k % 4 == 2 ? v.z : v.w);
      }
      __syncthreads();
      uint16_t* hg = reinterpret_cast<uint16_t*>(a.h) + static_cast<size_t>(l) * T * kTopK * kI;
      const mx::WarpRing ring{base + sm.ring + warp * mx::kSlots * mx::kRec, bars + 3 + warp * mx::kSlots, uses};
      const int U = T * kTopK * mx::kGuSlices;
      mx::GateUp(ly.gu_mx, xb, sel, RowBegin(U, b, nb), RowBegin(U, b + 1, nb), ring, part, hg);
      mx::DownIssueFirst<T>(ly.dn_mx, sel, b, ring);
      Arrive(cnt + 3);
      AwaitAll(cnt + 3);
      uint16_t* hb = reinterpret_cast<uint16_t*>(base);  // over xs: gate/up is done
      for (int i = tid; i < T * kTopK * kI / 8; i += kThreads)
        reinterpret_cast<uint4*>(hb)[i] = __ldcg(reinterpret_cast<const uint4*>(hg) + i);
      __syncthreads();
      mx::Down<T>(ly.dn_mx, hb, sel, wt, b, ring, part, mix);
      float* snext = a.s + static_cast<size_t>(l + 1) * T * kD;
      const int m0 = 16 * b, mn = b < mx::kDnSlices ? 16 : 0;
      for (int i = tid; i < T * mn; i += kThreads) {
        const int t = i / mn, r = m0 + i % mn;
        snext[t * kD + r] = __ldcg(s + t * kD + r) + __ldcg(y2 + t * kD + r) + mix[t * 16 + i % mn];
      }
    } else {
      const int ngu = GuChunks(rp0, rp1);
      auto issue_gu = [&](int k) {
        const GuChunk c = GuChunkAt(rp0, rp1, k);
        const int st = k % 2, e = sel[c.j];
        unsigned char* dst = base + sm.ring + st * kGuStage;
        uint64_t* bar = &ring[st];
        const uint32_t cb = c.n * kD, sb = c.n * (kD / 32) * 2;
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        MbarrierArriveExpectTx(bar, 2 * (cb + sb));
        for (int g = 0; g < 2; ++g) {
          const size_t row = static_cast<size_t>(e) * 2 * kI + g * kI + c.q;
          BulkCopyToShared(dst + g * kGuChunk * kD, ly.gu + row * kD, cb, bar);
          BulkCopyToShared(dst + 2 * kGuChunk * kD + g * kGuChunk * (kD / 32) * 2, ly.gu_sc + row * (kD / 32), sb, bar);
        }
      };
      if (tid == 0) {
        if (ngu > 0) issue_gu(0);
        if (ngu > 1) issue_gu(1);
      }
      for (int k = 0; k < ngu; ++k) {
        const GuChunk c = GuChunkAt(rp0, rp1, k);
        const int st = k % 2, t = c.j / kTopK;
        MbarrierWait(&ring[st], uses[st] & 1);
        ++uses[st];
        const unsigned char* src = base + sm.ring + st * kGuStage;
        for (int g = 0; g < 2; ++g) {
          float* out = g == 0 ? gate : up;
          ComputeRows<1>(reinterpret_cast<const int8_t*>(src + g * kGuChunk * kD),
                         reinterpret_cast<const uint16_t*>(src + 2 * kGuChunk * kD + g * kGuChunk * (kD / 32) * 2), c.n,
                         kD, xs + t * (kD / 4), [&](int, int r, float v) { out[r] = v; });
        }
        __syncthreads();
        if (tid < c.n) {
          const float g = gate[tid];
          h[static_cast<size_t>(c.j) * kI + c.q + tid] = g / (1.f + expf(-g)) * up[tid];
        }
        if (tid == 0 && k + 2 < ngu) issue_gu(k + 2);
        __syncthreads();
      }
      Arrive(cnt + 3);
      // 5. Down: the block's rows of every pair, the pairs' products added in pair order. Its first
      // rows are requested before the wait: they depend only on the routing, and the ring's region is
      // free once this block's gate/up is done (the plan's third source of gain).
      const int pairs = T * kTopK;
      auto issue_dn = [&](int j) {
        const int st = j % kRing, e = sel[j];
        unsigned char* dst = base + sm.ring + st * kDnStage;
        uint64_t* bar = &ring[st];
        const uint32_t cb = dn * kI, sb = dn * (kI / 32) * 2;
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        MbarrierArriveExpectTx(bar, cb + sb);
        const size_t row = static_cast<size_t>(e) * kD + d0;
        BulkCopyToShared(dst, ly.dn + row * kI, cb, bar);
        BulkCopyToShared(dst + kDownRows * kI, ly.dn_sc + row * (kI / 32), sb, bar);
      };
      if (tid == 0)
        for (int j = 0; j < min(kRing, pairs); ++j) issue_dn(j);
      AwaitAll(cnt + 3);
      constexpr int n4h = kI / 4;
      for (int i = tid; i < pairs * n4h; i += kThreads) {
        const int j = i / n4h, q = i % n4h;
        xs[j * n4h + XsSlot(q / 4, q % 4)] = __ldcg(reinterpret_cast<const float4*>(h) + i);
      }
      for (int i = tid; i < T * kDownRows; i += kThreads) mix[i] = 0.f;
      __syncthreads();
      for (int j = 0; j < pairs; ++j) {
        const int st = j % kRing, t = j / kTopK;
        MbarrierWait(&ring[st], uses[st] & 1);
        ++uses[st];
        const unsigned char* src = base + sm.ring + st * kDnStage;
        const float w = wt[j];
        ComputeRows<1>(reinterpret_cast<const int8_t*>(src), reinterpret_cast<const uint16_t*>(src + kDownRows * kI),
                       dn, kI, xs + j * n4h, [&](int, int r, float v) { mix[t * kDownRows + r] += w * v; });
        __syncthreads();
        if (tid == 0 && j + kRing < pairs) issue_dn(j + kRing);
      }
      float* snext = a.s + static_cast<size_t>(l + 1) * T * kD;
      for (int i = tid; i < T * dn; i += kThreads) {
        const int t = i / dn, r = d0 + i % dn;
        snext[t * kD + r] = __ldcg(s + t * kD + r) + __ldcg(y2 + t * kD + r) + mix[t * kDownRows + i % dn];
      }
    }
    Arrive(cnt + 4);
  }
}

// ---- host ----

float Bf16Round(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}
float HalfToFloat(uint16_t h) {
  const __half_raw r{h};
  return __half2float(__half(r));
}

template <typename T>
std::vector<T> Down(const T* p, size_t n) {
  std::vector<T> v(n);
  CK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// A split-Q8 matrix (host copies) as floats code · scale: exact (8 and 11 significant bits).
std::vector<float> HostQ8(const std::vector<int8_t>& w, const std::vector<uint16_t>& sc) {
  std::vector<float> f(w.size());
  for (size_t i = 0; i < w.size(); ++i) f[i] = static_cast<float>(w[i]) * HalfToFloat(sc[i / 32]);
  return f;
}

std::vector<double> HostNorm(const std::vector<double>& v, const std::vector<float>& norm, bool round) {
  double ss = 0;
  for (double e : v) ss += e * e;
  const double inv = 1.0 / std::sqrt(ss / kD + 1e-6);
  std::vector<double> y(kD);
  for (int k = 0; k < kD; ++k) {
    y[k] = v[k] * inv * norm[k];
    if (round) y[k] = Bf16Round(static_cast<float>(y[k]));
  }
  return y;
}

// Expert e's MXFP4 matrix (gate: g = 0, up: g = 1, down: g = 2) as floats [rows][K], read back.
std::vector<float> HostMx(const Layer& ly, int e, int g) {
  const int slices = g < 2 ? mx::kGuSlices : mx::kDnSlices, chunks = g < 2 ? mx::kGuChunks : mx::kDnChunks;
  const int64_t first = g < 2 ? mx::GuRecord(e, g, 0, 0) : mx::DnRecord(e, 0, 0);
  const std::vector<uint8_t> rec =
      Down((g < 2 ? ly.gu_mx : ly.dn_mx) + first * mx::kRec, static_cast<size_t>(slices) * chunks * mx::kRec);
  const int K = chunks * mx::kCols;
  std::vector<float> w(static_cast<size_t>(slices) * 16 * K);
  for (int sl = 0; sl < slices; ++sl)
    for (int kc = 0; kc < chunks; ++kc) {
      const uint8_t* r = rec.data() + (static_cast<size_t>(sl) * chunks + kc) * mx::kRec;
      for (int rr = 0; rr < 16; ++rr)
        for (int k = 0; k < mx::kCols; ++k)
          w[static_cast<size_t>(16 * sl + rr) * K + kc * mx::kCols + k] = mx::MxRecordValue(r, rr, k);
    }
  return w;
}
// y[r] = Σ_k w[r][k] · x[k] in double.
std::vector<double> HostRows(const std::vector<float>& w, int rows, int K, const std::vector<double>& x) {
  std::vector<double> y(rows);
  for (int r = 0; r < rows; ++r) {
    double acc = 0;
    for (int k = 0; k < K; ++k) acc += static_cast<double>(w[static_cast<size_t>(r) * K + k]) * x[k];
    y[r] = acc;
  }
  return y;
}

// The layers [0, L) on the host from s0 [T][kD]: the s after them (MXFP4 experts where `mx`).
std::vector<double> HostChain(const std::vector<Layer>& layers, int L, int T, const std::vector<float>& s0,
                              const std::vector<float>& norm, bool mx_experts) {
  std::vector<double> s(s0.begin(), s0.end());
  for (int l = 0; l < L; ++l) {
    const Layer& ly = layers[l];
    std::vector<std::vector<int8_t>> w(3);
    std::vector<std::vector<uint16_t>> sc(3);
    for (int p = 0; p < 3; ++p) {
      w[p] = Down(ly.w[p], static_cast<size_t>(Rows(p)) * Cols(p));
      sc[p] = Down(ly.sc[p], static_cast<size_t>(Rows(p)) * Cols(p) / 32);
    }
    std::vector<double> next(s.size());
    for (int t = 0; t < T; ++t) {
      std::vector<double> st(s.begin() + t * kD, s.begin() + (t + 1) * kD);
      const std::vector<double> xn = HostNorm(st, norm, true);
      std::vector<double> y1 = HostRows(HostQ8(w[0], sc[0]), kN1, kD, xn);
      for (double& e : y1) e = Bf16Round(static_cast<float>(e));
      const std::vector<double> y2 =
          HostRows(HostQ8(w[1], sc[1]), kD, kK2, std::vector<double>(y1.begin(), y1.begin() + kK2));
      std::vector<double> v(kD);
      for (int k = 0; k < kD; ++k) v[k] = st[k] + static_cast<float>(y2[k]);
      const std::vector<double> xr = HostNorm(v, norm, false);
      const std::vector<double> logits = HostRows(HostQ8(w[2], sc[2]), kE, kD, xr);
      std::vector<int> order(kE);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return logits[x] > logits[y]; });
      double sum = 0;
      for (int k = 0; k < kTopK; ++k) sum += std::exp(logits[order[k]] - logits[order[0]]);
      std::vector<double> mix(kD, 0.0);
      for (int k = 0; k < kTopK; ++k) {
        const int e = order[k];
        std::vector<double> d;
        if (mx_experts) {  // bf16 activations, bf16 gate and up into silu, bf16 h (as the kernel)
          std::vector<double> xb(kD), hh(kI);
          for (int k = 0; k < kD; ++k) xb[k] = Bf16Round(static_cast<float>(xr[k]));
          const std::vector<double> g = HostRows(HostMx(ly, e, 0), kI, kD, xb),
                                    u = HostRows(HostMx(ly, e, 1), kI, kD, xb);
          for (int i = 0; i < kI; ++i) {
            const double gr = Bf16Round(static_cast<float>(g[i]));
            hh[i] = Bf16Round(static_cast<float>(gr / (1.0 + std::exp(-gr)) * Bf16Round(static_cast<float>(u[i]))));
          }
          d = HostRows(HostMx(ly, e, 2), kD, kI, hh);
        } else {
          const std::vector<int8_t> gu =
              Down(ly.gu + static_cast<size_t>(e) * 2 * kI * kD, static_cast<size_t>(2) * kI * kD);
          const std::vector<uint16_t> gs =
              Down(ly.gu_sc + static_cast<size_t>(e) * 2 * kI * (kD / 32), static_cast<size_t>(2) * kI * (kD / 32));
          const std::vector<int8_t> dw = Down(ly.dn + static_cast<size_t>(e) * kD * kI, static_cast<size_t>(kD) * kI);
          const std::vector<uint16_t> ds =
              Down(ly.dn_sc + static_cast<size_t>(e) * kD * (kI / 32), static_cast<size_t>(kD) * (kI / 32));
          const std::vector<double> g = HostRows(HostQ8(gu, gs), 2 * kI, kD, xr);
          std::vector<double> hh(kI);
          for (int i = 0; i < kI; ++i) hh[i] = g[i] / (1.0 + std::exp(-g[i])) * g[kI + i];
          d = HostRows(HostQ8(dw, ds), kD, kI, hh);
        }
        const double wk = std::exp(logits[e] - logits[order[0]]) / sum;
        for (int r = 0; r < kD; ++r) mix[r] += wk * d[r];
      }
      for (int r = 0; r < kD; ++r) next[t * kD + r] = v[r] + mix[r];
    }
    s = next;
  }
  return s;
}

int Main(int argc, char** argv) {
  int L = 48, iters = 20, check_layers = 2;
  std::vector<int> tokens = {1, 2};
  std::string experts = "both";  // --experts q8_0 | mxfp4 | both
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) != "--experts")
      rest.push_back(argv[i]);
    else if (i + 1 < argc)
      experts = argv[++i];
    else
      return std::fprintf(stderr, "--experts needs a value\n"), 2;
  }
  if (experts != "q8_0" && experts != "mxfp4" && experts != "both")
    return std::fprintf(stderr, "--experts: q8_0, mxfp4 or both, not %s\n", experts.c_str()), 2;
  if (!ParseFlags(static_cast<int>(rest.size()), rest.data(),
                  {{"--layers", &L}, {"--iters", &iters}, {"--check-layers", &check_layers}}, &tokens))
    return 2;
  std::vector<bool> formats;  // MXFP4 experts or not
  if (experts != "mxfp4") formats.push_back(false);
  if (experts != "q8_0") formats.push_back(true);
  if (L < 1 || iters < 1 || check_layers < 1 || check_layers > L)
    return std::fprintf(stderr, "--layers, --iters positive; --check-layers in [1, --layers]\n"), 2;
  for (int T : tokens)
    if (T != 1 && T != 2) return std::fprintf(stderr, "--tokens: 1 or 2\n"), 2;
  PersistDevice dv;
  if (!FindPersistDevice("persistent_layer_bench", &dv)) return 77;
  const int sms = dv.sms, smem_optin = dv.smem_optin;
  if (sms * kDownRows < kD || !dv.coop) {
    std::fprintf(stderr, "persistent_layer_bench: needs %d SMs or more and cooperative launch\n", kD / kDownRows);
    return 1;
  }
  const double copy = CopyRate();
  std::printf("device %s, %d SMs, copy %.0f GB/s, %d layers\n", dv.name.c_str(), sms, copy, L);

  std::vector<Layer> layers(L);
  auto alloc_fill = [](size_t n, float scale, uint32_t seed, const int8_t** w, const uint16_t** sc) {
    int8_t* dw = nullptr;
    uint16_t* ds = nullptr;
    CK(cudaMalloc(&dw, n));
    CK(cudaMalloc(&ds, n / 32 * 2));
    FillCodes<<<1024, 256>>>(dw, n, 0x9e3779b9u * seed);
    FillScales<<<256, 256>>>(ds, n / 32, scale, 0x85ebca6bu * seed);
    *w = dw;
    *sc = ds;
  };
  for (int l = 0; l < L; ++l) {
    for (int p = 0; p < 3; ++p)
      alloc_fill(static_cast<size_t>(Rows(p)) * Cols(p), p == 1 ? 3e-4f : 1e-4f, 8 * l + p + 1, &layers[l].w[p],
                 &layers[l].sc[p]);
    if (experts != "mxfp4") {
      alloc_fill(static_cast<size_t>(kE) * 2 * kI * kD, 1e-4f, 8 * l + 4, &layers[l].gu, &layers[l].gu_sc);
      alloc_fill(static_cast<size_t>(kE) * kD * kI, 1e-3f, 8 * l + 5, &layers[l].dn, &layers[l].dn_sc);
    }
    if (experts != "q8_0") {  // |w| ~ 2.4 * 2^-10 (gate/up), 2.4 * 2^-6 (down): as the Q8_0 experts'
      uint8_t *gu = nullptr, *dn = nullptr;
      const int64_t ngu = mx::GuRecord(kE, 0, 0, 0), ndn = mx::DnRecord(kE, 0, 0);
      CK(cudaMalloc(&gu, ngu * mx::kRec));
      CK(cudaMalloc(&dn, ndn * mx::kRec));
      mx::FillMx<<<1024, 256>>>(gu, ngu, 243, 0x27d4eb2fu * (8 * l + 6));
      mx::FillMx<<<1024, 256>>>(dn, ndn, 247, 0x165667b1u * (8 * l + 7));
      layers[l].gu_mx = gu;
      layers[l].dn_mx = dn;
    }
  }
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  Layer* d_layers = nullptr;
  CK(cudaMalloc(&d_layers, sizeof(Layer) * L));
  CK(cudaMemcpy(d_layers, layers.data(), sizeof(Layer) * L, cudaMemcpyHostToDevice));
  double dense_bytes = 0;
  for (int p = 0; p < 3; ++p) dense_bytes += static_cast<double>(Rows(p)) * Cols(p) * (1 + 1.0 / 16);
  const double pair_q8 = (2.0 * kI * kD + static_cast<double>(kD) * kI) * (1 + 1.0 / 16),
               pair_mx = static_cast<double>(mx::GuRecord(1, 0, 0, 0) + mx::DnRecord(1, 0, 0)) * mx::kRec;

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  bool ok = true;
  std::printf(
      "| experts | tokens | persistent layer (no attention) | bytes a layer | of copy |\n|---|---|---|---|---|\n");
  for (const bool mxe : formats)
    for (int T : tokens) {
      const Smem sm = SmemFor(sms, T, mxe);
      if (sm.total + 256 > static_cast<size_t>(smem_optin)) {
        std::fprintf(stderr, "needs %zu bytes of shared memory a block, %d allowed\n", sm.total, smem_optin);
        return 1;
      }
      std::vector<float> hs(static_cast<size_t>(T) * kD), hn(kD);
      Lcg rnd{777u + T};
      for (auto& v : hs) v = 1.7f * rnd();
      for (auto& v : hn) v = 1.f + 0.2f * rnd();
      float *s = nullptr, *norm = nullptr, *y2 = nullptr, *y3 = nullptr, *h = nullptr;
      uint16_t* y1 = nullptr;
      unsigned* counters = nullptr;
      CK(cudaMalloc(&s, static_cast<size_t>(L + 1) * T * kD * 4));
      CK(cudaMalloc(&norm, kD * 4));
      CK(cudaMalloc(&y1, static_cast<size_t>(L) * T * kN1 * 2));
      CK(cudaMalloc(&y2, static_cast<size_t>(L) * T * kD * 4));
      CK(cudaMalloc(&y3, static_cast<size_t>(L) * T * kE * 4));
      CK(cudaMalloc(&h, static_cast<size_t>(L) * T * kTopK * kI * 4));
      CK(cudaMalloc(&counters, static_cast<size_t>(L) * kPhases * 4));
      CK(cudaMemcpy(s, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(norm, hn.data(), hn.size() * 4, cudaMemcpyHostToDevice));
      auto kernel = T == 1 ? (mxe ? PersistentLayer<1, true> : PersistentLayer<1, false>)
                           : (mxe ? PersistentLayer<2, true> : PersistentLayer<2, false>);
      CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sm.total)));
      auto reset = [&] { CK(cudaMemsetAsync(counters, 0, static_cast<size_t>(L) * kPhases * 4, st)); };
      auto run = [&](int layers_run) {
        LayerArgs a{d_layers, layers_run, T, s, norm, y1, y2, y3, h, counters};
        Smem ss = sm;
        void* args[] = {&a, &ss};
        CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), dim3(sms), dim3(kThreads), args, sm.total, st));
      };
      // The check first.
      reset();
      run(check_layers);
      CK(cudaStreamSynchronize(st));
      const std::vector<float> got = Down(s + static_cast<size_t>(check_layers) * T * kD, static_cast<size_t>(T) * kD);
      const std::vector<double> want = HostChain(layers, check_layers, T, hs, hn, mxe);
      double m = 0, d = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        m = std::max(m, std::fabs(want[i] - hs[i]));
        d = std::max(d, std::fabs(want[i] - got[i]));
      }
      const bool same = std::isfinite(d) && m > 0 && d <= 1e-2 * m;
      ok = ok && same;
      // Then the timing.
      const double per_layer_s = TimeMs(
                                     reset, [&] { run(L); }, iters, st) *
                                 1e-3 / L;
      const double bytes = dense_bytes + T * kTopK * (mxe ? pair_mx : pair_q8);
      std::printf("| %s | %d | %.2f us | %.1f MB | %.0f %% |\n", mxe ? "MXFP4" : "Q8_0", T, per_layer_s * 1e6,
                  bytes / 1e6, 100.0 * bytes / per_layer_s / 1e9 / copy);
      std::printf(
          "  check %s T=%d, %d layers against the host: the residual's increment max |diff| %.3g of max %.3g: %s\n",
          mxe ? "MXFP4" : "Q8_0", T, check_layers, d, m, same ? "ok" : "MISMATCH");
      for (void* p : {static_cast<void*>(s), static_cast<void*>(norm), static_cast<void*>(y1), static_cast<void*>(y2),
                      static_cast<void*>(y3), static_cast<void*>(h), static_cast<void*>(counters)})
        CK(cudaFree(p));
    }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace moeshard::bench

int main(int argc, char** argv) { return moeshard::bench::Main(argc, argv); }
