// read_bandwidth_bench: how fast this GPU reads HBM the ways the decode kernels read weights —
// plain 128-bit loads (the dense GEMVs; 4, 8 or 16 in flight a thread, grid-stride or a warp
// reading one contiguous run), and 1-D bulk copies into shared memory through per-warp
// rings (the experts' direct GEMV, kernels/moe/moe_stream_direct.cu: one copy of 2,048 code
// bytes and one of 256 scale bytes a chunk, two chunks a warp in flight) at 1-32 KB a copy —
// each against the device-to-device copy rate measured in the same run (2 x bytes / time, the
// "copy bandwidth" of docs/PERFORMANCE.md). Nothing is computed: the figures are the ceilings of
// each way of reading, for choosing between them (issue 13: the experts' direct GEMV streams at
// ~70 % of the DRAM peak under ncu; the dense GEMVs' plain loads at 2.5-2.8 TB/s).
//
//   read_bandwidth_bench [--gib 2] [--iters 5] [--sizes 1024,2048,...] [--slots 2,4] [--warps 8]
//                        [--blocks N]
//
// Per row: the way, the bytes a copy, the ring (copies in flight a warp; plain rows: loads in
// flight a thread), the layout (each warp one contiguous run of chunks, as a warp's slice of an
// expert; or consecutive chunks on consecutive warps; plain rows: grid-stride or
// warp-contiguous), warps a block (fewer than --warps where a block's rings would not fit),
// blocks an SM (as many as fit, at most --blocks: the direct GEMV runs 4 of 8 warps), the bytes
// in flight an SM, GB/s read, and that over the copy rate.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/copy_rate.h"
#include "bench/cuda_exit.h"
#include "kernels/cuda/mbarrier.cuh"

namespace {

using moeshard::gpu::BulkCopyToShared;
using moeshard::gpu::ElectOne;
using moeshard::gpu::MbarrierArriveExpectTx;
using moeshard::gpu::MbarrierInit;
using moeshard::gpu::MbarrierWait;

// Plain loads: each thread kLoads 16-byte loads an iteration (non-coherent, not kept in L1),
// XORed into one word so that none is dead; `sink` written only if the XOR is a value no fill
// gives. Grid-stride: load k of a thread is a whole grid's width from load k - 1 (each warp
// instruction 512 contiguous bytes, a thread's loads far apart). Warp-contiguous (kWarpRun): a
// warp's kLoads instructions cover kLoads x 512 contiguous bytes, as a GEMV warp reads its row.
template <int kLoads, bool kWarpRun>
__global__ void __launch_bounds__(256) PlainLoads(const uint4* __restrict__ src, size_t n16, uint32_t* sink) {
  const size_t threads = size_t{gridDim.x} * blockDim.x;
  const size_t tid = size_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const size_t lane = threadIdx.x % 32, warp = tid / 32;
  // Element of load k in iteration `it`.
  auto at = [&](size_t it, int k) -> size_t {
    if constexpr (kWarpRun) return (it * (threads / 32) + warp) * (32 * kLoads) + k * 32 + lane;
    return it * threads * kLoads + tid + k * threads;
  };
  uint32_t acc = 0;
  const size_t iters = n16 / (threads * kLoads);
  for (size_t it = 0; it < iters; ++it) {
    uint4 v[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w)
                   : "l"(src + at(it, k)));
    }
#pragma unroll
    for (int k = 0; k < kLoads; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (size_t i = iters * threads * kLoads + tid; i < n16; i += threads) acc ^= src[i].x;
  if (acc == 0x9e3779b9u) *sink = acc;
}

extern __shared__ __align__(128) uint8_t smem[];

// Bulk copies: warp w's ring of kSlots buffers of `copy` bytes (+ `extra` bytes from `src2` a
// chunk when nonzero: the scales beside the codes); chunk c of `chunks` goes to warp
// c / per_warp (contiguous) or c % warps_total (interleaved). One word of each chunk is read
// from shared memory once it has landed, so the ring turns as the GEMV's does.
template <int kSlots>
__global__ void BulkRing(const uint8_t* __restrict__ src, const uint8_t* __restrict__ src2, uint32_t copy,
                         uint32_t extra, int64_t chunks, int contiguous, uint32_t* sink) {
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t gw = int64_t{blockIdx.x} * warps + warp, nw = int64_t{gridDim.x} * warps;
  const uint32_t stage = copy + extra;
  uint8_t* ring = smem + static_cast<size_t>(warp) * kSlots * stage;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(warps) * kSlots * stage) + warp * kSlots;
  if (threadIdx.x % 32 == 0) {
    for (int s = 0; s < kSlots; ++s) MbarrierInit(bars + s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncwarp();
  // This warp's chunks: [first, first + count) one by one, or first, first + nw, ...
  const int64_t per = (chunks + nw - 1) / nw;
  const int64_t first = contiguous ? gw * per : gw;
  const int64_t left = chunks - first;
  const int64_t count =
      contiguous ? (left <= 0 ? 0 : (left < per ? left : per)) : (gw < chunks ? (chunks - 1 - gw) / nw + 1 : 0);
  const int64_t step = contiguous ? 1 : nw;
  auto issue = [&](int64_t k) {
    if (k >= count || !ElectOne()) return;
    const int64_t c = first + k * step;
    uint64_t* bar = bars + k % kSlots;
    uint8_t* dst = ring + (k % kSlots) * stage;
    MbarrierArriveExpectTx(bar, stage);
    BulkCopyToShared(dst, src + c * copy, copy, bar);
    if (extra) BulkCopyToShared(dst + copy, src2 + c * extra, extra, bar);
  };
  for (int k = 0; k < kSlots; ++k) issue(k);
  uint32_t acc = 0;
  for (int64_t k = 0; k < count; ++k) {
    MbarrierWait(bars + k % kSlots, static_cast<uint32_t>((k / kSlots) & 1));
    acc ^= reinterpret_cast<const uint32_t*>(ring + (k % kSlots) * stage)[threadIdx.x % 32];
    __syncwarp();
    issue(k + kSlots);
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// Median ms of `iters` runs of launch() (one warm-up first).
template <typename F>
double TimeMs(F launch, int iters) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  launch();
  CK(cudaGetLastError());
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::vector<long> ParseList(const char* s) {
  std::vector<long> v;
  for (std::string t = s; !t.empty();) {
    const size_t c = t.find(',');
    v.push_back(std::atol(t.substr(0, c).c_str()));
    t = c == std::string::npos ? "" : t.substr(c + 1);
  }
  return v;
}

struct BulkOpts {
  int warps = 8;       // warps a block asked for (fewer where the ring does not fit)
  int max_blocks = 0;  // blocks an SM at most (0: as many as fit)
  int sms = 0, iters = 5;
  double copy_rate = 0;
};

// One plain-load row of the table.
template <int kLoads, bool kWarpRun>
void RunPlain(const uint8_t* src, size_t bytes, int max_blocks, int sms, int iters, double copy_rate, uint32_t* sink) {
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, PlainLoads<kLoads, kWarpRun>, 256, 0));
  if (max_blocks > 0) per_sm = std::min(per_sm, max_blocks);
  const double ms = TimeMs(
      [&] {
        PlainLoads<kLoads, kWarpRun><<<per_sm * sms, 256>>>(reinterpret_cast<const uint4*>(src), bytes / 16, sink);
      },
      iters);
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("| plain 16-byte loads | - | %d a thread | %s | 8 | %d | %d | %.0f | %.1f %% |\n", kLoads,
              kWarpRun ? "warp-contiguous" : "grid-stride", per_sm, per_sm * 256 * kLoads * 16 / 1024, gbs,
              100.0 * gbs / copy_rate);
}

template <int kSlots>
void RunBulk(const uint8_t* src, const uint8_t* src2, size_t bytes, uint32_t copy, uint32_t extra, int contiguous,
             const BulkOpts& o, uint32_t* sink) {
  const char* layout = contiguous ? "contiguous" : "interleaved";
  int optin = 0;
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  const size_t per_warp = static_cast<size_t>(kSlots) * (copy + extra + 8);
  const int warps = std::min<int>(o.warps, static_cast<int>(static_cast<size_t>(optin) / per_warp));
  if (warps < 1) {
    std::printf("| bulk | %u + %u | %d | %s | - | - | - | does not fit (%zu bytes a warp) | |\n", copy, extra, kSlots,
                layout, per_warp);
    return;
  }
  const size_t smem_bytes = static_cast<size_t>(warps) * per_warp;
  CK(cudaFuncSetAttribute(BulkRing<kSlots>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes)));
  CK(cudaFuncSetAttribute(BulkRing<kSlots>, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, BulkRing<kSlots>, warps * 32, smem_bytes));
  if (o.max_blocks > 0) per_sm = std::min(per_sm, o.max_blocks);
  if (per_sm == 0) {
    std::printf("| bulk | %u + %u | %d | %s | %d | 0 | - | no block fits | |\n", copy, extra, kSlots, layout, warps);
    return;
  }
  const int64_t chunks = static_cast<int64_t>(bytes / copy);
  const double ms = TimeMs(
      [&] {
        BulkRing<kSlots><<<per_sm * o.sms, warps * 32, smem_bytes>>>(src, src2, copy, extra, chunks, contiguous, sink);
      },
      o.iters);
  const double gbs = static_cast<double>(chunks) * (copy + extra) / (ms * 1e-3) / 1e9;
  const double in_flight_kb = static_cast<double>(per_sm) * warps * kSlots * (copy + extra) / 1024.0;
  std::printf("| bulk | %u + %u | %d | %s | %d | %d | %.0f | %.0f | %.1f %% |\n", copy, extra, kSlots, layout, warps,
              per_sm, in_flight_kb, gbs, 100.0 * gbs / o.copy_rate);
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 2;
  int iters = 5, warps = 8, max_blocks = 0;
  std::vector<long> sizes = {1024, 2048, 4096, 8192, 16384, 32768}, slots = {2, 4};
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 == argc) {
      std::fprintf(stderr, "%s needs a value\n", a.c_str());
      return 2;
    }
    if (a == "--blocks") {
      max_blocks = std::atoi(argv[i + 1]);
    } else if (a == "--gib") {
      gib = std::atof(argv[i + 1]);
    } else if (a == "--iters") {
      iters = std::atoi(argv[i + 1]);
    } else if (a == "--sizes") {
      sizes = ParseList(argv[i + 1]);
    } else if (a == "--slots") {
      slots = ParseList(argv[i + 1]);
    } else if (a == "--warps") {
      warps = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (gib <= 0 || iters < 1 || warps < 1 || warps > 32 || max_blocks < 0) {
    std::fprintf(stderr, "--gib > 0, --iters >= 1, 1 <= --warps <= 32, --blocks >= 0\n");
    return 2;
  }
  for (long k : slots) {
    if (k != 2 && k != 4) {
      std::fprintf(stderr, "--slots: 2 or 4 (got %ld)\n", k);
      return 2;
    }
  }
  for (long s : sizes) {
    if (s < 256 || s % 256 != 0 || s > 65536) {
      std::fprintf(stderr, "--sizes: multiples of 256 bytes, 256..65536 (got %ld)\n", s);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  const size_t bytes = static_cast<size_t>(gib * (1 << 30)) / 65536 * 65536;
  uint8_t *src = nullptr, *src2 = nullptr;
  uint32_t* sink = nullptr;
  CK(cudaMalloc(&src, bytes));
  CK(cudaMalloc(&src2, bytes / 8));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(src, 0x35, bytes));
  CK(cudaMemset(src2, 0x53, bytes / 8));
  const double copy_rate = moeshard::bench::CopyRate();
  std::printf("%s, %d SMs; device-to-device copy %.0f GB/s; %.2f GiB read a run, median of %d\n\n", prop.name,
              prop.multiProcessorCount, copy_rate, bytes / double(1 << 30), iters);
  std::printf(
      "| way | bytes a copy (+ scales) | ring | layout | warps a block | blocks an SM | KB in flight an SM "
      "| GB/s | of copy |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  RunPlain<4, false>(src, bytes, max_blocks, prop.multiProcessorCount, iters, copy_rate, sink);
  RunPlain<8, false>(src, bytes, max_blocks, prop.multiProcessorCount, iters, copy_rate, sink);
  RunPlain<4, true>(src, bytes, max_blocks, prop.multiProcessorCount, iters, copy_rate, sink);
  RunPlain<8, true>(src, bytes, max_blocks, prop.multiProcessorCount, iters, copy_rate, sink);
  RunPlain<16, true>(src, bytes, max_blocks, prop.multiProcessorCount, iters, copy_rate, sink);
  BulkOpts o;
  o.warps = warps, o.max_blocks = max_blocks, o.sms = prop.multiProcessorCount, o.iters = iters;
  o.copy_rate = copy_rate;
  for (long s : sizes) {
    for (long k : slots) {
      for (int contiguous : {1, 0}) {
        for (uint32_t extra : {0u, static_cast<uint32_t>(s / 8)}) {
          if (k == 2) {
            RunBulk<2>(src, src2, bytes, static_cast<uint32_t>(s), extra, contiguous, o, sink);
          } else {
            RunBulk<4>(src, src2, bytes, static_cast<uint32_t>(s), extra, contiguous, o, sink);
          }
        }
      }
    }
  }
  CK(cudaFree(src));
  CK(cudaFree(src2));
  CK(cudaFree(sink));
  return 0;
}
