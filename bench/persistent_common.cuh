// The persistent benchmarks' device pieces (bench/persistent_chain_bench.cu,
// bench/persistent_layer_bench.cu): counter barriers between the phases of one cooperative launch,
// x staged as swizzled fp32 pieces (as gemv.cu stages it), a warp a split-Q8 row computed from
// shared memory, and the hash fills of their random weights.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "bench/cuda_exit.h"
#include "kernels/cuda/act.cuh"

namespace moeshard::bench {

inline constexpr int kPersistThreads = 256;
inline constexpr int kPersistWarps = kPersistThreads / 32;

__device__ __forceinline__ int XsSlot(int c, int p) { return 4 * c + (p ^ ((c >> 1) & 3)); }

__device__ __forceinline__ void RedRelease(unsigned* c) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
}
__device__ __forceinline__ unsigned LoadAcquire(const unsigned* c) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
  return v;
}

// Every block's stores of a phase done: count this block (thread 0, after the block's barrier). No
// fence: the block barrier orders the block's stores before thread 0's add, and a release at gpu
// scope is cumulative over them (the PTX memory model; cooperative groups' grid sync does the same).
__device__ __forceinline__ void Arrive(unsigned* c) {
  __syncthreads();
  if (threadIdx.x == 0) RedRelease(c);
}
// A barrier that never completes (a bug in a phase's bookkeeping) traps after 2^24 polls (~10 s of L2 round trips)
// instead of hanging the GPU lane: the launch then fails with an illegal-instruction error.
__device__ __forceinline__ void AwaitAll(const unsigned* c) {
  if (threadIdx.x == 0) {
    for (uint32_t polls = 0; LoadAcquire(c) < gridDim.x; ++polls) {
      if (polls == (1u << 24)) {
        printf("persistent barrier %p: %u of %u blocks after 2^24 polls (block %u)\n", static_cast<const void*>(c),
               LoadAcquire(c), gridDim.x, blockIdx.x);
        __trap();
      }
    }
  }
  __syncthreads();  // the acquire's order passes to the block through its barrier
}

// x rows [T][K] of bf16 (row stride `stride`) into the swizzled fp32 pieces, through L2.
__device__ inline void StageBf16(float4* xs, const uint16_t* x, int64_t stride, int K, int T) {
  const int n4 = K / 4;
  for (int i = threadIdx.x; i < T * n4; i += blockDim.x) {
    const int t = i / n4, q = i % n4;
    const uint2 b = __ldcg(reinterpret_cast<const uint2*>(x + t * stride) + q);
    xs[t * n4 + XsSlot(q / 4, q % 4)] = make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u),
                                                    __uint_as_float(b.y << 16), __uint_as_float(b.y & 0xffff0000u));
  }
}

// Token t's rmsnorm(v0 + v1) ⊙ norm (v0, v1: [T][K] fp32 read through L2, v1 may be null) into xs's
// pieces; rounded to bf16 if `round`; its bf16 also to xn[t] if xn is given. Every thread of the block.
__device__ inline void NormInto(float4* xs, int t, int K, const float* v0, const float* v1, const float* norm,
                                bool round, uint16_t* xn, float* scratch /* [32] */) {
  const int n4 = K / 4;
  float ss = 0.f;
  for (int q = threadIdx.x; q < n4; q += blockDim.x) {
    float4 v = __ldcg(reinterpret_cast<const float4*>(v0 + t * K) + q);
    if (v1) {
      const float4 d = __ldcg(reinterpret_cast<const float4*>(v1 + t * K) + q);
      v = make_float4(v.x + d.x, v.y + d.y, v.z + d.z, v.w + d.w);
    }
    ss += gpu::Sq4(v);
    xs[t * n4 + XsSlot(q / 4, q % 4)] = v;
  }
  ss = gpu::BlockSum(ss, scratch);
  const float inv = rsqrtf(ss / K + 1e-6f);
  for (int q = threadIdx.x; q < n4; q += blockDim.x) {
    float4& v = xs[t * n4 + XsSlot(q / 4, q % 4)];
    const float4 nn = reinterpret_cast<const float4*>(norm)[q];
    v = make_float4(v.x * inv * nn.x, v.y * inv * nn.y, v.z * inv * nn.z, v.w * inv * nn.w);
    const uint2 p = gpu::PackBf16x4(v);
    if (xn) reinterpret_cast<uint2*>(xn + t * K)[q] = p;
    if (round)
      v = make_float4(__uint_as_float(p.x << 16), __uint_as_float(p.x & 0xffff0000u), __uint_as_float(p.y << 16),
                      __uint_as_float(p.y & 0xffff0000u));
  }
}

// y[t][r0 + i] = Σ_k code[i][k] · scale[i][k / 32] · x[t][k] for the block's rows (a warp a row).
template <int T, typename Store>
__device__ void ComputeRows(const int8_t* codes, const uint16_t* scales, int nrows, int K, const float4* xs,
                            Store store) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nchunks = K / 16, n4 = K / 4;
  for (int r = warp; r < nrows; r += kPersistWarps) {
    float acc[T] = {};
    for (int c = lane; c < nchunks; c += 32) {
      const uint4 v = *reinterpret_cast<const uint4*>(codes + static_cast<size_t>(r) * K + 16 * c);
      const float sc = __half2float(__ushort_as_half(scales[static_cast<size_t>(r) * (K / 32) + c / 2]));
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      float w[16];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          w[4 * i + j] = static_cast<float>(static_cast<int32_t>(words[i] << (24 - 8 * j)) >> 24);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float s = 0.f;
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          const float4 x = xs[t * n4 + XsSlot(c, p)];
          s = fmaf(w[4 * p], x.x, s);
          s = fmaf(w[4 * p + 1], x.y, s);
          s = fmaf(w[4 * p + 2], x.z, s);
          s = fmaf(w[4 * p + 3], x.w, s);
        }
        acc[t] = fmaf(sc, s, acc[t]);
      }
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float s = gpu::WarpSum(acc[t]);
      if (lane == 0) store(t, r, s);
    }
  }
}

static __global__ void FillCodes(int8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = static_cast<int8_t>(static_cast<int>(h % 255) - 127);
  }
}
static __global__ void FillScales(uint16_t* p, size_t n, float base, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const uint32_t h = (static_cast<uint32_t>(i) * 2246822519u) ^ seed;
    p[i] = __half_as_ushort(__float2half(base * (0.75f + 0.5f * static_cast<float>(h >> 8) / 16777216.f)));
  }
}

// Uniform floats in [-1, 1) from a linear congruential sequence: the benches' activations.
struct Lcg {
  uint32_t r;
  float operator()() {
    r = r * 1664525u + 1013904223u;
    return (static_cast<float>(r >> 8) / 16777216.f) * 2.f - 1.f;
  }
};

// Integer flags (`--name N`, and `--tokens A,B,...` into *tokens when given) from argv: false with a
// line on stderr for an unknown flag, a missing value or one that is not a whole number (no silent 0).
struct IntFlag {
  const char* name;
  int* value;
};
inline bool ParseWhole(const char* s, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || v < -(1L << 30) || v > (1L << 30)) return false;
  *out = static_cast<int>(v);
  return *end == '\0' || *end == ',';
}
inline bool ParseFlags(int argc, char** argv, std::initializer_list<IntFlag> flags, std::vector<int>* tokens) {
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) return std::fprintf(stderr, "%s needs a value\n", k.c_str()), false;
    const char* v = argv[i + 1];
    bool known = false, good = true;
    if (k == "--tokens") {
      known = true;
      tokens->clear();
      for (const char* p = v; good && *p;) {
        int t = 0;
        good = ParseWhole(p, &t);
        tokens->push_back(t);
        p = std::strchr(p, ',');
        p = p ? p + 1 : v + std::strlen(v);
      }
      good = good && !tokens->empty();
    }
    for (const IntFlag& f : flags)
      if (k == f.name) known = true, good = ParseWhole(v, f.value) && !std::strchr(v, ',');
    if (!known) return std::fprintf(stderr, "unknown flag %s\n", k.c_str()), false;
    if (!good) return std::fprintf(stderr, "%s: not a whole number: %s\n", k.c_str(), v), false;
  }
  return true;
}

// Median ms of `iters` runs of timed() (after one unmeasured), each after reset() outside the events.
template <typename Reset, typename Timed>
float TimeMs(Reset&& reset, Timed&& timed, int iters, cudaStream_t st) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i <= iters; ++i) {
    reset();
    CK(cudaEventRecord(e0, st));
    timed();
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (i > 0) ms.push_back(t);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The device the persistent launches run on; false (and a line on stderr) without one.
struct PersistDevice {
  int sms = 0, smem_optin = 0, coop = 0;
  std::string name;
};
inline bool FindPersistDevice(const char* prog, PersistDevice* d) {
  int n = 0, dev = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "%s: no CUDA device\n", prog);
    return false;
  }
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&d->sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&d->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  CK(cudaDeviceGetAttribute(&d->coop, cudaDevAttrCooperativeLaunch, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  d->name = prop.name;
  return true;
}

}  // namespace moeshard::bench
