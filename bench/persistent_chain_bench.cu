// persistent_chain_bench: what a persistent decode kernel would save over the chain of launches
// (issue 13; docs/PERFORMANCE.md "Where issue 13 stands": a one- to eight-stream decode step is ~8
// dependent kernels a layer, each paying its boundary and its dependent round trips). It measures,
// on the Qwen3-30B shape's dense part of a layer (split Q8 weights) for T tokens, over L layers
// whose weights are all different (so they stream from DRAM, as in a step):
//
//   boundaries  3 empty launches a layer with PDL in a CUDA graph (wait, one dependent L2 read, trigger,
//               one write): the cost of a kernel boundary alone
//   barriers    one persistent launch (a block an SM), 3 grid-wide counters a layer (release add,
//               acquire spin), one dependent L2 read after each: the cost of a counter barrier
//   production  the product's Gemv (kernels/cuda/gemv.h) 3 times a layer in a CUDA graph: Q/K/V
//               [5,120 x 2,048] on the normed input; O [2,048 x 4,096] on Q/K/V's first 4,096
//               outputs; the router [128 x 2,048] on rmsnorm(s + O's output), which also writes the
//               next layer's normed input (its residual prologue) — the chain as the runner launches it
//   persistent  the same three products in one persistent launch: each block owns a fixed share of
//               every matrix's rows, copied into shared memory (1-D bulk copies, one buffer a matrix),
//               the phases apart by counter barriers. Twice: the rows requested when the phase before
//               starts (one phase ahead, as PDL lets a launch load while the one before runs), and the
//               *next* layer's rows requested as soon as the block has used this layer's (a layer
//               ahead: the DRAM stream never waits on a barrier)
//
// Per row: µs a layer (median of --iters runs of the whole L-layer chain / L), and for those with
// weights the bytes a layer over the device-to-device copy rate measured in the same run. The
// persistent chain's outputs (every layer's router logits and the last normed input) are checked
// against the production chain's (different summation order, so a relative tolerance): the run
// fails (exit 1) if they differ by more than 1e-2 of their largest value (ctest
// persistent_chain_check runs 4 layers so, label gpu; exit 77 without a device).
//
//   persistent_chain_bench [--layers 48] [--tokens 1,4] [--iters 20]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/copy_rate.h"
#include "bench/cuda_exit.h"
#include "bench/persistent_common.cuh"
#include "kernels/cuda/act.cuh"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/pdl.cuh"

namespace moeshard::bench {
namespace {

using gpu::BulkCopyToShared;
using gpu::MbarrierArriveExpectTx;
using gpu::MbarrierInit;
using gpu::MbarrierWait;

constexpr int kD = 2048;   // hidden
constexpr int kN1 = 5120;  // Q/K/V rows (32 + 2 x 4 heads of 128)
constexpr int kK2 = 4096;  // O's input (32 heads of 128)
constexpr int kN3 = 128;   // router rows
constexpr int kThreads = kPersistThreads;
constexpr uint32_t kCopyPiece = 16384;

struct Layer {
  const int8_t* w[3];
  const uint16_t* sc[3];
};

struct ChainArgs {
  const Layer* layers;
  int L, T;
  const float* s;      // [T, kD] the residual stream (the same every layer)
  const float* norm;   // [kD]
  uint16_t* xn;        // [L + 1][T, kD] bf16: xn[0] given, xn[l + 1] from layer l's router phase
  uint16_t* y1;        // [L][T, kN1] bf16
  float* y2;           // [L][T, kD]
  float* y3;           // [L][T, kN3]
  unsigned* counters;  // [L][3], zero before the launch
  // 0: the barriers and their dependent reads only; 1: each matrix's next-layer rows requested once
  // the block has used this layer's (a layer ahead); 2: a matrix's rows requested when the phase
  // before it starts (one phase ahead: what PDL gives a chain of launches)
  int with_weights;
};

__host__ __device__ constexpr int Rows(int p) { return p == 0 ? kN1 : p == 1 ? kD : kN3; }
__host__ __device__ constexpr int Cols(int p) { return p == 1 ? kK2 : kD; }
__host__ __device__ inline int RowBegin(int p, int b, int nb) { return static_cast<int>(int64_t{Rows(p)} * b / nb); }

// Shared memory: x (fp32 [T][4,096], chunk pieces swizzled as gemv.cu's), then per matrix the
// block's rows' codes and scales, then three mbarriers.
struct Smem {
  size_t codes[3], scales[3], bars, total;
};

Smem SmemFor(int nb, int T) {
  Smem s{};
  size_t off = static_cast<size_t>(T) * kK2 * sizeof(float);
  for (int p = 0; p < 3; ++p) {
    int m = 0;
    for (int b = 0; b < nb; ++b) m = std::max(m, RowBegin(p, b + 1, nb) - RowBegin(p, b, nb));
    s.codes[p] = off;
    off += static_cast<size_t>(m) * Cols(p);
    s.scales[p] = off;
    off += static_cast<size_t>(m) * (Cols(p) / 32) * 2;
  }
  s.bars = off;
  s.total = off + 3 * sizeof(uint64_t);
  return s;
}

// The block's rows of matrix p of layer l into its buffer, counted on bars[p].
__device__ void IssueWeights(const ChainArgs& a, const Smem& sm, unsigned char* base, int p, int l) {
  const int r0 = RowBegin(p, blockIdx.x, gridDim.x), r1 = RowBegin(p, blockIdx.x + 1, gridDim.x);
  if (r1 == r0) return;
  uint64_t* bar = reinterpret_cast<uint64_t*>(base + sm.bars) + p;
  const uint32_t cb = static_cast<uint32_t>(r1 - r0) * Cols(p),
                 sb = static_cast<uint32_t>(r1 - r0) * (Cols(p) / 32) * 2;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the buffer's generic reads before the copies' writes
  MbarrierArriveExpectTx(bar, cb + sb);
  const Layer& ly = a.layers[l];
  const unsigned char* src = reinterpret_cast<const unsigned char*>(ly.w[p]) + static_cast<size_t>(r0) * Cols(p);
  for (uint32_t o = 0; o < cb; o += kCopyPiece)
    BulkCopyToShared(base + sm.codes[p] + o, src + o, min(kCopyPiece, cb - o), bar);
  const unsigned char* ssrc =
      reinterpret_cast<const unsigned char*>(ly.sc[p]) + static_cast<size_t>(r0) * (Cols(p) / 32) * 2;
  BulkCopyToShared(base + sm.scales[p], ssrc, sb, bar);
}

template <int T>
__global__ void __launch_bounds__(kThreads, 1) PersistentChain(ChainArgs a, Smem sm) {
  extern __shared__ __align__(128) unsigned char base[];
  float4* xs = reinterpret_cast<float4*>(base);
  uint64_t* bars = reinterpret_cast<uint64_t*>(base + sm.bars);
  __shared__ float scratch[32];
  const int nb = gridDim.x, b = blockIdx.x;
  int rb[3], nr[3];
  for (int p = 0; p < 3; ++p) {
    rb[p] = RowBegin(p, b, nb);
    nr[p] = RowBegin(p, b + 1, nb) - rb[p];
  }
  if (threadIdx.x == 0) {
    for (int p = 0; p < 3; ++p) MbarrierInit(&bars[p], 1);
    gpu::FenceMbarrierInit();
  }
  __syncthreads();
  const bool ahead = a.with_weights == 1, phase_ahead = a.with_weights == 2;
  if (a.with_weights && threadIdx.x == 0)
    for (int p = 0; p < (ahead ? 3 : 1); ++p) IssueWeights(a, sm, base, p, 0);
  auto issue = [&](bool when, int p, int l) {
    if (when && threadIdx.x == 0 && l < a.L) IssueWeights(a, sm, base, p, l);
  };
  for (int l = 0; l < a.L; ++l) {
    const uint32_t parity = l & 1;
    unsigned* cnt = a.counters + 3 * l;
    // Matrix p's rows of this layer, once their copies have landed, into `store`.
    auto dense = [&](int p, auto store) {
      MbarrierWait(&bars[p], parity);
      ComputeRows<T>(reinterpret_cast<const int8_t*>(base + sm.codes[p]),
                     reinterpret_cast<const uint16_t*>(base + sm.scales[p]), nr[p], Cols(p), xs, store);
    };
    // Q/K/V on xn[l] (the router phase of layer l - 1 wrote it).
    if (l > 0) AwaitAll(cnt - 1);
    issue(phase_ahead, 1, l);
    StageBf16(xs, a.xn + static_cast<size_t>(l) * T * kD, kD, kD, T);
    __syncthreads();
    if (a.with_weights && nr[0] > 0) {
      uint16_t* y1 = a.y1 + static_cast<size_t>(l) * T * kN1;
      dense(0, [&](int t, int r, float v) { y1[t * kN1 + rb[0] + r] = gpu::DevF32ToBf16(v); });
    }
    Arrive(cnt + 0);
    issue(ahead, 0, l + 1);
    // O on Q/K/V's first 4,096 outputs.
    AwaitAll(cnt + 0);
    issue(phase_ahead, 2, l);
    StageBf16(xs, a.y1 + static_cast<size_t>(l) * T * kN1, kN1, kK2, T);
    __syncthreads();
    if (a.with_weights && nr[1] > 0) {
      float* y2 = a.y2 + static_cast<size_t>(l) * T * kD;
      dense(1, [&](int t, int r, float v) { y2[t * kD + rb[1] + r] = v; });
    }
    Arrive(cnt + 1);
    issue(ahead, 1, l + 1);
    // The router on rmsnorm(s + O's output); block 0 writes it as the next layer's xn.
    AwaitAll(cnt + 1);
    issue(phase_ahead, 0, l + 1);
    if (nr[2] > 0 || b == 0) {
      for (int t = 0; t < T; ++t)
        NormInto(xs, t, kD, a.s, a.y2 + static_cast<size_t>(l) * T * kD, a.norm, false,
                 b == 0 ? a.xn + static_cast<size_t>(l + 1) * T * kD : nullptr, scratch);
      __syncthreads();
    }
    if (a.with_weights && nr[2] > 0) {
      float* y3 = a.y3 + static_cast<size_t>(l) * T * kN3;
      dense(2, [&](int t, int r, float v) { y3[t * kN3 + rb[2] + r] = v; });
    }
    Arrive(cnt + 2);
    issue(ahead, 2, l + 1);
  }
}

// A kernel boundary alone: wait, read what the kernel before wrote, let the next one start, write.
__global__ void Boundary(const unsigned* in, unsigned* out) {
  gpu::PdlWait();
  const unsigned v = __ldcg(in + blockIdx.x);
  gpu::PdlTrigger();
  if (threadIdx.x == 0) out[blockIdx.x] = v + 1;
}

int Main(int argc, char** argv) {
  int L = 48, iters = 20;
  std::vector<int> tokens = {1, 4};
  if (!ParseFlags(argc, argv, {{"--layers", &L}, {"--iters", &iters}}, &tokens)) return 2;
  if (L < 1 || iters < 1) return std::fprintf(stderr, "--layers and --iters must be positive\n"), 2;
  for (int T : tokens)
    if (T != 1 && T != 2 && T != 4) return std::fprintf(stderr, "--tokens: 1, 2 or 4\n"), 2;
  PersistDevice dv;
  if (!FindPersistDevice("persistent_chain_bench", &dv)) return 77;
  const int sms = dv.sms, smem_optin = dv.smem_optin, coop = dv.coop;
  const double copy = CopyRate();
  std::printf("device %s, %d SMs, copy %.0f GB/s, %d layers\n", dv.name.c_str(), sms, copy, L);

  // Weights: every layer its own, codes in [-127, 127], scales near 1e-4 (Q/K/V, router) and 3e-4
  // (O), so O's output is ~0.1 of s and the chain's values stay of order one.
  std::vector<Layer> layers(L);
  size_t layer_bytes = 0;
  for (int l = 0; l < L; ++l) {
    for (int p = 0; p < 3; ++p) {
      const size_t n = static_cast<size_t>(Rows(p)) * Cols(p), ns = n / 32;
      int8_t* w = nullptr;
      uint16_t* sc = nullptr;
      CK(cudaMalloc(&w, n));
      CK(cudaMalloc(&sc, ns * 2));
      FillCodes<<<512, 256>>>(w, n, 0x9e3779b9u * (3 * l + p + 1));
      FillScales<<<64, 256>>>(sc, ns, p == 1 ? 3e-4f : 1e-4f, 0x85ebca6bu * (3 * l + p + 1));
      layers[l].w[p] = w;
      layers[l].sc[p] = sc;
      if (l == 0) layer_bytes += n + ns * 2;
    }
  }
  CK(cudaGetLastError());
  Layer* d_layers = nullptr;
  CK(cudaMalloc(&d_layers, sizeof(Layer) * L));
  CK(cudaMemcpy(d_layers, layers.data(), sizeof(Layer) * L, cudaMemcpyHostToDevice));

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  bool ok = true;
  std::printf(
      "| tokens | boundaries (3 a layer, PDL, graph) | barriers (3 a layer, persistent) | production Gemv x 3 (of "
      "copy) "
      "| persistent, weights a phase ahead | persistent, a layer ahead | bytes a layer | production / a layer ahead "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (int T : tokens) {
    // Activations.
    std::vector<float> hs(static_cast<size_t>(T) * kD), hn(kD);
    std::vector<uint16_t> hx(static_cast<size_t>(T) * kD);
    Lcg rnd{12345u + T};
    for (auto& v : hs) v = 1.7f * rnd();
    for (auto& v : hn) v = 1.f + 0.2f * rnd();
    for (auto& v : hx) {
      const float f = 1.7f * rnd();
      uint32_t u;
      std::memcpy(&u, &f, 4);
      v = static_cast<uint16_t>(u >> 16);
    }
    float *s = nullptr, *norm = nullptr, *y2 = nullptr, *y3 = nullptr;
    uint16_t *xn = nullptr, *y1 = nullptr;
    unsigned* counters = nullptr;
    CK(cudaMalloc(&s, hs.size() * 4));
    CK(cudaMalloc(&norm, hn.size() * 4));
    CK(cudaMalloc(&xn, static_cast<size_t>(L + 1) * T * kD * 2));
    CK(cudaMalloc(&y1, static_cast<size_t>(L) * T * kN1 * 2));
    CK(cudaMalloc(&y2, static_cast<size_t>(L) * T * kD * 4));
    CK(cudaMalloc(&y3, static_cast<size_t>(L) * T * kN3 * 4));
    CK(cudaMalloc(&counters, static_cast<size_t>(L) * 3 * 4));
    CK(cudaMemcpy(s, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(norm, hn.data(), hn.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(xn, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));

    // Production: three Gemv calls a layer, captured into one graph.
    cudaGraphExec_t prod_exec = nullptr;
    for (int pass = 0; pass < 2; ++pass) {  // pass 0 eager (the launchers' one-time set-up), pass 1 captured
      if (pass == 1) CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      for (int l = 0; l < L; ++l) {
        // Matrix p of layer l on x (bf16, row stride `stride`, 0: its columns) into y.
        auto q8 = [&](int p, const void* x, int64_t stride, gpu::ActDType y_dtype, void* y) {
          gpu::GemvParams g;
          g.wtype = gpu::GemvWeight::kQ8;
          g.x = x;
          g.x_dtype = gpu::ActDType::kBF16;
          g.x_stride = stride;
          g.cols = Cols(p);
          g.num_tokens = T;
          g.y_dtype = y_dtype;
          g.m[0] = {layers[l].w[p], layers[l].sc[p], Rows(p), nullptr, y, 0};
          return g;
        };
        gpu::GemvParams q =
            q8(0, xn + static_cast<size_t>(l) * T * kD, 0, gpu::ActDType::kBF16, y1 + static_cast<size_t>(l) * T * kN1);
        gpu::GemvParams o = q8(1, y1 + static_cast<size_t>(l) * T * kN1, kN1, gpu::ActDType::kF32,
                               y2 + static_cast<size_t>(l) * T * kD);
        gpu::GemvParams rt = q8(2, nullptr, 0, gpu::ActDType::kF32, y3 + static_cast<size_t>(l) * T * kN3);
        rt.res.s = s;
        rt.res.add = y2 + static_cast<size_t>(l) * T * kD;
        rt.res.norm = norm;
        rt.res.eps = 1e-6f;
        rt.res.xn = xn + static_cast<size_t>(l + 1) * T * kD;
        rt.res.xn_dtype = gpu::ActDType::kBF16;
        for (const gpu::GemvParams* g : {&q, &o, &rt}) {
          const absl::Status stt = gpu::Gemv(*g, st);
          if (!stt.ok()) {
            std::fprintf(stderr, "Gemv: %s\n", std::string(stt.message()).c_str());
            return 1;
          }
        }
      }
      if (pass == 0) {
        CK(cudaStreamSynchronize(st));
        continue;
      }
      cudaGraph_t g;
      CK(cudaStreamEndCapture(st, &g));
      CK(cudaGraphInstantiate(&prod_exec, g, 0));
      CK(cudaGraphDestroy(g));
    }
    auto none = [] {};
    auto graph = [&](cudaGraphExec_t e) { return [e, st] { CK(cudaGraphLaunch(e, st)); }; };
    const float prod_ms = TimeMs(none, graph(prod_exec), iters, st);
    std::vector<float> ref3(static_cast<size_t>(L) * T * kN3);
    std::vector<uint16_t> refx(static_cast<size_t>(T) * kD);
    CK(cudaMemcpy(ref3.data(), y3, ref3.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(refx.data(), xn + static_cast<size_t>(L) * T * kD, refx.size() * 2, cudaMemcpyDeviceToHost));

    // Boundaries alone: 3L empty launches in a graph, one block an SM each.
    unsigned* flags = nullptr;
    CK(cudaMalloc(&flags, static_cast<size_t>(3 * L + 1) * sms * 4));
    CK(cudaMemset(flags, 0, static_cast<size_t>(3 * L + 1) * sms * 4));
    cudaGraphExec_t bnd_exec = nullptr;
    {
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < 3 * L; ++i) {
        CK(gpu::LaunchPdl(Boundary, dim3(sms), dim3(kThreads), 0, st, flags + static_cast<size_t>(i) * sms,
                          flags + static_cast<size_t>(i + 1) * sms));
      }
      cudaGraph_t g;
      CK(cudaStreamEndCapture(st, &g));
      CK(cudaGraphInstantiate(&bnd_exec, g, 0));
      CK(cudaGraphDestroy(g));
    }
    const float bnd_ms = TimeMs(none, graph(bnd_exec), iters, st);

    // Persistent: a block an SM, launched cooperatively (all resident, or the launch fails).
    const Smem sm = SmemFor(sms, T);
    if (sm.total > static_cast<size_t>(smem_optin) || !coop) {
      std::fprintf(stderr, "persistent chain needs %zu bytes of shared memory a block (%d allowed), cooperative %d\n",
                   sm.total, smem_optin, coop);
      return 1;
    }
    auto kernel = T == 1 ? PersistentChain<1> : T == 2 ? PersistentChain<2> : PersistentChain<4>;
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sm.total)));
    ChainArgs ca{d_layers, L, T, s, norm, xn, y1, y2, y3, counters, 0};
    auto reset = [&] { CK(cudaMemsetAsync(counters, 0, static_cast<size_t>(L) * 3 * 4, st)); };
    auto persist = [&] {
      ChainArgs aa = ca;
      Smem ss = sm;
      void* args[] = {&aa, &ss};
      CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kernel), dim3(sms), dim3(kThreads), args, sm.total, st));
    };
    const float bar_ms = TimeMs(reset, persist, iters, st);
    auto bf = [](uint16_t v) {
      const uint32_t u = static_cast<uint32_t>(v) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    };
    // One persistent run with weights (mode 1 or 2), checked against the production chain's outputs.
    std::string checks;
    auto with_weights = [&](int mode) {
      ca.with_weights = mode;
      CK(cudaMemset(y3, 0, static_cast<size_t>(L) * T * kN3 * 4));
      CK(cudaMemset(xn + static_cast<size_t>(T) * kD, 0, static_cast<size_t>(L) * T * kD * 2));
      const float ms = TimeMs(reset, persist, iters, st);
      std::vector<float> got3(ref3.size());
      std::vector<uint16_t> gotx(refx.size());
      CK(cudaMemcpy(got3.data(), y3, got3.size() * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(gotx.data(), xn + static_cast<size_t>(L) * T * kD, gotx.size() * 2, cudaMemcpyDeviceToHost));
      double m3 = 0, d3 = 0, mx = 0, dx = 0;
      for (size_t i = 0; i < ref3.size(); ++i) {
        m3 = std::max(m3, std::fabs(static_cast<double>(ref3[i])));
        d3 = std::max(d3, std::fabs(static_cast<double>(ref3[i]) - got3[i]));
      }
      for (size_t i = 0; i < refx.size(); ++i) {
        mx = std::max(mx, std::fabs(static_cast<double>(bf(refx[i]))));
        dx = std::max(dx, std::fabs(static_cast<double>(bf(refx[i])) - bf(gotx[i])));
      }
      const bool same =
          std::isfinite(d3) && std::isfinite(dx) && m3 > 0 && mx > 0 && d3 <= 1e-2 * m3 && dx <= 1e-2 * mx;
      ok = ok && same;
      char line[256];
      std::snprintf(
          line, sizeof line,
          "  check T=%d, mode %d: router logits max |diff| %.3g of max %.3g, last normed input %.3g of %.3g: %s\n", T,
          mode, d3, m3, dx, mx, same ? "ok" : "MISMATCH");
      checks += line;
      return ms;
    };
    const float phase_ms = with_weights(2);
    const float per_ms = with_weights(1);
    const double us = 1e3 / L;
    auto pct = [&](float ms) { return 100.0 * layer_bytes / (ms * 1e-3 / L) / 1e9 / copy; };
    std::printf(
        "| %d | %.2f us | %.2f us | %.2f us (%.0f %%) | %.2f us (%.0f %%) | %.2f us (%.0f %%) | %.1f MB | %.2fx |\n", T,
        bnd_ms * us, bar_ms * us, prod_ms * us, pct(prod_ms), phase_ms * us, pct(phase_ms), per_ms * us, pct(per_ms),
        layer_bytes / 1e6, prod_ms / per_ms);
    std::fputs(checks.c_str(), stdout);
    CK(cudaGraphExecDestroy(prod_exec));
    CK(cudaGraphExecDestroy(bnd_exec));
    for (void* p :
         {static_cast<void*>(s), static_cast<void*>(norm), static_cast<void*>(xn), static_cast<void*>(y1),
          static_cast<void*>(y2), static_cast<void*>(y3), static_cast<void*>(counters), static_cast<void*>(flags)})
      CK(cudaFree(p));
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace moeshard::bench

int main(int argc, char** argv) { return moeshard::bench::Main(argc, argv); }
