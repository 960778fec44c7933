// attention_prefill_bench: causal prefill attention over a paged bf16 cache, each prefill kernel
// on the same batch (issue 14: "4096-token causal prefill >= 1.5x PyTorch SDPA (flash) in the
// same run"; the peer is bench/torch_peers.py's attention row, run in the same device call).
//
//   attention_prefill_bench [--lens 4096,16384] [--heads 32x4x128,128x16x64] [--iters 20]
//
// Per length N (one sequence, positions 0..N-1, its 16-token blocks shuffled over the pool) and
// head shape (query heads x KV heads x head_dim): median of CUDA-event-timed calls of
// gpu::Attention per kernel, TFLOP/s of the causal work (QKᵀ and PV over the lower triangle:
// 4 N (N + 1) / 2 head_dim FLOPs per query head), and each kernel's largest difference from the
// tensor-core kernel's output relative to its largest value.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/cuda_exit.h"
#include "common/dtype.h"
#include "kernels/cuda/gpu_ops.h"

namespace moeshard {
namespace {

struct Heads {
  int64_t nq = 32, nkv = 4, hd = 128;
};

std::vector<uint16_t> RandomBf16(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = F32ToBf16(nd(rng));
  return v;
}

template <typename T>
T* Upload(const std::vector<T>& v) {
  T* d = nullptr;
  CK(cudaMalloc(&d, v.size() * sizeof(T)));
  CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Median ms of `iters` calls (after 2 warm-ups), or -1 when the kernel refuses the shape.
double PrefillTimeMs(gpu::AttentionParams ap, int iters) {
  if (!gpu::ResolveAttentionAlgo(ap).ok()) return -1;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int it = 0; it < iters + 2; ++it) {
    CK(cudaEventRecord(e0));
    const absl::Status st = gpu::Attention(ap, nullptr);
    if (!st.ok()) {
      std::fprintf(stderr, "attention_prefill_bench: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (it >= 2) ms.push_back(t);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::vector<float> Output(void* d, size_t n) {
  std::vector<uint16_t> h(n);
  CK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = Bf16ToF32(h[i]);
  return f;
}

int PrefillBenchMain(int argc, char** argv) {
  std::vector<int64_t> lens = {4096, 16384};
  std::vector<Heads> heads = {{32, 4, 128}, {128, 16, 64}};
  int64_t iters = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    bool ok = i + 1 < argc;
    if (a == "--lens" && ok) {
      lens.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        int64_t n = 0;
        ok = ok && absl::SimpleAtoi(s, &n) && n >= 1;
        lens.push_back(n);
      }
    } else if (a == "--heads" && ok) {
      heads.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        std::vector<std::string> p = absl::StrSplit(s, 'x');
        Heads h;
        ok = ok && p.size() == 3 && absl::SimpleAtoi(p[0], &h.nq) && absl::SimpleAtoi(p[1], &h.nkv) &&
             absl::SimpleAtoi(p[2], &h.hd) && h.nkv >= 1 && h.nq >= h.nkv && h.nq % h.nkv == 0 && h.hd >= 4;
        heads.push_back(h);
      }
    } else if (a == "--iters" && ok) {
      ok = absl::SimpleAtoi(v, &iters) && iters >= 1;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "usage: attention_prefill_bench [--lens 4096,16384] [--heads 32x4x128,128x16x64] [--iters 20]\n");
      return a == "--help" ? 0 : 2;
    }
    ++i;
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "attention_prefill_bench: no CUDA device\n");
    return 77;
  }
  const int64_t bs = 16;
  std::mt19937 rng(11);
  std::printf("| tokens | heads (q x kv x dim) | kernel | time | TFLOP/s | max diff vs tensor-core |\n|---|---|---|---|---|---|\n");
  for (const Heads& h : heads) {
    for (int64_t len : lens) {
      const int64_t blocks = (len + bs - 1) / bs;
      std::vector<int32_t> pool(blocks), pos(len), off(len, 0);
      std::iota(pool.begin(), pool.end(), 0);
      std::shuffle(pool.begin(), pool.end(), rng);
      std::iota(pos.begin(), pos.end(), 0);
      const size_t cache = static_cast<size_t>(blocks * bs * h.nkv * h.hd), qn = static_cast<size_t>(len * h.nq * h.hd);
      uint16_t* k = Upload(RandomBf16(cache, rng));
      uint16_t* v = Upload(RandomBf16(cache, rng));
      uint16_t* q = Upload(RandomBf16(qn, rng));
      int32_t* dpos = Upload(pos);
      int32_t* doff = Upload(off);
      int32_t* dtab = Upload(pool);
      void *out = nullptr, *ref = nullptr;
      CK(cudaMalloc(&out, qn * 2));
      CK(cudaMalloc(&ref, qn * 2));
      gpu::AttentionParams ap;
      ap.q = q;
      ap.dtype = gpu::ActDType::kBF16;
      ap.num_tokens = len;
      ap.num_heads = h.nq;
      ap.pos = dpos;
      ap.table_offset = doff;
      ap.block_tables = dtab;
      ap.scale = 1.f / std::sqrt(static_cast<float>(h.hd));
      ap.cache = gpu::KvCacheView{k, v, nullptr, nullptr, gpu::KvElem::kBF16, bs, h.nkv, h.hd};
      ap.cache.num_blocks = blocks;
      ap.max_tokens_per_seq = len;
      const double flops = 4.0 * h.nq * h.hd * (static_cast<double>(len) * (len + 1) / 2);
      struct K {
        gpu::AttentionAlgo algo;
        const char* name;
      };
      std::vector<float> base;
      for (K kern : {K{gpu::AttentionAlgo::kTiledTensorCore, "tensor-core (mma.sync)"}, K{gpu::AttentionAlgo::kWgmma, "wgmma"},
                     K{gpu::AttentionAlgo::kAuto, "auto"}}) {
        ap.algo = kern.algo;
        ap.out = kern.algo == gpu::AttentionAlgo::kTiledTensorCore ? ref : out;
        const double ms = PrefillTimeMs(ap, static_cast<int>(iters));
        if (ms < 0) {
          std::printf("| %lld | %lldx%lldx%lld | %s | refused | | |\n", static_cast<long long>(len),
                      static_cast<long long>(h.nq), static_cast<long long>(h.nkv), static_cast<long long>(h.hd), kern.name);
          continue;
        }
        double diff = 0, top = 0;
        const std::vector<float> got = Output(ap.out, qn);
        if (kern.algo == gpu::AttentionAlgo::kTiledTensorCore) {
          base = got;
        } else if (!base.empty()) {
          for (size_t i = 0; i < qn; ++i) {
            diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - base[i]));
            top = std::max(top, std::fabs(static_cast<double>(base[i])));
          }
        }
        std::printf("| %lld | %lldx%lldx%lld | %s | %.1f us | %.0f | %s |\n", static_cast<long long>(len),
                    static_cast<long long>(h.nq), static_cast<long long>(h.nkv), static_cast<long long>(h.hd), kern.name,
                    ms * 1e3, flops / (ms * 1e-3) / 1e12,
                    base.empty() || kern.algo == gpu::AttentionAlgo::kTiledTensorCore
                        ? "-"
                        : (std::to_string(top > 0 ? diff / top : diff)).c_str());
      }
      for (void* p : {static_cast<void*>(k), static_cast<void*>(v), static_cast<void*>(q), static_cast<void*>(dpos),
                      static_cast<void*>(doff), static_cast<void*>(dtab), out, ref}) {
        CK(cudaFree(p));
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace moeshard

int main(int argc, char** argv) { return moeshard::PrefillBenchMain(argc, argv); }
