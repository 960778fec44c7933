// moe_expert_bench: the MoE expert step of one GPU's shard (issue 5) against its floor and a
// cuBLAS baseline. E_local = 32 of 256 experts, top-8, L = I = 4096, NVFP4 weights, bf16
// activations, per-expert RMS norm on; routing uniform or Zipf-skewed (the hottest expert is
// local, the other ranks spread at random).
//
// Per T: the kernel is first checked against kernels/cpu/moe_ref on fresh inputs (a sample
// of tokens), then timed: median of per-run CUDA event pairs over warm runs that rotate over
// 4 weight sets, routings and inputs (each set ≥ 0.9 GB, the L2 is 60 MB). Bytes = touched
// experts' weights and scales + x + out; FLOPs = 6·L·I per local pair; floor = max(bytes /
// copy bandwidth, FLOPs / bf16 GEMM rate), both ceilings measured at start. Baseline: the
// weights expanded to bf16 beforehand, per-expert cublasGemmEx (gate|up stacked, then down)
// with the grouping computed on the host (it gets the counts for free: no host sync).
//
//   moe_expert_bench [--t 1,8,64] [--skip-baseline] [--stages] [--iters N]
//                    [--format q8_0|mxfp4|bf16|nvfp4] [--shape issue5|qwen30b]
//                    [--routing uniform|zipf|both] [--no-hint] [--no-repack]
// --stages adds each kernel's time alone (MoeExpertStepStages) under each row (a pair step's GEMM
// stages include the memset that zeroes their item counters, which the route does in a step); the
// last column names the kernels the timed steps took (the dispatcher's path counts).
// --shape qwen30b: E_local = 128 of 128 experts, top-8, L = 2048, I = 768 (Qwen3-30B-A3B on
// one GPU); T defaults to 1, 4, 8, 64, 4096. --format picks the experts' weight format (the
// random bytes are made sane: see bench::SaneWeights). The step gets the caller's format hint
// (MoeExpertParams::expert_formats) unless --no-hint; with it, the workspace has room for the
// wgmma path's expanded weights (MOESHARD_MOE_WGMMA=0 keeps the GEMV/mma kernels). NVFP4, MXFP4 and Q8_0
// weights are repacked at load (MoeRepackNvfp4 / MoeRepackMxfp4 / MoeRepackQ8: the streaming kernels)
// unless --no-repack or --no-hint; the reference check reads the original weights.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/moe_expert_baseline.h"
#include "bench/cuda_exit.h"
#include "common/dtype.h"
#include "kernels/cpu/moe_ref.h"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/moe/moe_expert.h"
#include "kernels/moe/moe_launch.h"

namespace moeshard {
namespace {

constexpr int kTopK = 8, kSets = 4, kBaseSets = 2;
int kE = 32, kEAll = 256;
int64_t kL = 4096, kI = 4096;
WeightFormat kFormat = WeightFormat::kNVFP4;
bool kUseHint = true;
bool kRepack = true;

#define CB(expr)                                                                         \
  do {                                                                                   \
    cublasStatus_t s_ = (expr);                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                   \
      std::fprintf(stderr, "%s:%d %s: cublas %d\n", __FILE__, __LINE__, #expr, int(s_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

template <typename T = uint8_t>
T* DevAlloc(size_t bytes) {
  void* p = nullptr;
  CK(cudaMalloc(&p, bytes));
  return static_cast<T*>(p);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Which kernels the timed steps took, from the dispatcher's counts before and after them.
const char* PathName(const gpu::MoePathCounts& a, const gpu::MoePathCounts& b) {
  if (b.stream_wgmma_pair > a.stream_wgmma_pair) return "wgmma-pair";
  if (b.stream_wgmma > a.stream_wgmma) return "wgmma-registers";
  if (b.stream_split > a.stream_split) return "split-rows";
  if (b.stream_direct > a.stream_direct) return "direct-repacked";
  if (b.wgmma > a.wgmma) return "wgmma-expanded";
  if (b.stream > a.stream) return "streaming";
  if (b.direct > a.direct) return "direct-stored";
  if (b.generic > a.generic) return "generic";
  return "gemv";
}

// Median milliseconds of fn(i) over `iters` runs after `warm` runs, one event pair each.
template <typename Fn>
double TimeMs(Fn&& fn, int warm, int iters) {
  for (int i = 0; i < warm; ++i) fn(i);
  std::vector<cudaEvent_t> ev(iters + 1);
  for (auto& e : ev) CK(cudaEventCreate(&e));
  CK(cudaEventRecord(ev[0]));
  for (int i = 0; i < iters; ++i) {
    fn(i);
    CK(cudaEventRecord(ev[i + 1]));
  }
  CK(cudaEventSynchronize(ev[iters]));
  CK(cudaGetLastError());
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    float m = 0;
    CK(cudaEventElapsedTime(&m, ev[i], ev[i + 1]));
    ms[i] = m;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return Median(ms);
}

// One expert matrix [rows, cols] on the device, contiguous rows in kFormat.
struct MatDev {
  uint8_t* data;
  uint8_t* scale;  // NVFP4 only
  float scale2;
  WeightRef Ref(int64_t rows, int64_t cols) const {
    WeightRef w;
    w.format = kFormat;
    w.rows = rows;
    w.cols = cols;
    w.data = data;
    w.row_stride_bytes = WeightRowBytes(kFormat, cols);
    if (kFormat == WeightFormat::kNVFP4) {
      w.scale = scale;
      w.scale_row_stride = cols / 16;
      w.scale2 = scale2;
    }
    return w;
  }
};

struct WeightSet {
  std::vector<gpu::MoeExpertWeights> host;  // device pointers, original layout (reference, baseline)
  gpu::MoeExpertWeights* dev = nullptr;     // what the step reads: repacked NVFP4 when kRepack
  uint32_t hint = 0;                        // MoeExpertFormats of host
};

// A routing of T tokens: ids (local index or -1), weights, and its grouping.
struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> w;
  std::vector<int32_t> rows, pos, offsets;  // as the route kernel groups them
  int32_t* d_ids = nullptr;
  float* d_w = nullptr;
  int32_t* d_rows = nullptr;
  int32_t* d_pos = nullptr;
  uint16_t* d_x = nullptr;
  int touched = 0;
};

void MakeRouting(int64_t T, bool zipf, std::mt19937& rng, Routing& r) {
  std::vector<int> perm(kEAll);
  for (int i = 0; i < kEAll; ++i) perm[i] = i;
  std::shuffle(perm.begin() + 1, perm.end(), rng);  // rank 0 is expert 0, local
  std::vector<double> pz(kEAll);
  for (int i = 0; i < kEAll; ++i) pz[i] = 1.0 / std::pow(i + 1.0, 1.1);
  std::discrete_distribution<int> zd(pz.begin(), pz.end());
  std::uniform_int_distribution<int> ud(0, kEAll - 1);
  std::uniform_real_distribution<float> wd(0.f, 1.f);
  r.ids.assign(T * kTopK, -1);
  r.w.assign(T * kTopK, 0.f);
  for (int64_t t = 0; t < T; ++t) {
    int picked[kTopK];
    float sum = 0;
    for (int k = 0; k < kTopK; ++k) {
      int e;
      bool dup;
      do {
        e = zipf ? perm[zd(rng)] : ud(rng);
        dup = std::find(picked, picked + k, e) != picked + k;
      } while (dup);
      picked[k] = e;
      r.w[t * kTopK + k] = std::exp(2.f * wd(rng));
      sum += r.w[t * kTopK + k];
      r.ids[t * kTopK + k] = e < kE ? e : -1;
    }
    for (int k = 0; k < kTopK; ++k) r.w[t * kTopK + k] /= sum;
  }
  r.offsets.assign(kE + 1, 0);
  r.rows.clear();
  r.pos.assign(T * kTopK, -1);
  for (int e = 0; e < kE; ++e) {
    r.offsets[e] = static_cast<int32_t>(r.rows.size());
    for (int64_t i = 0; i < T * kTopK; ++i) {
      if (r.ids[i] == e) r.pos[i] = static_cast<int32_t>(r.rows.size()), r.rows.push_back(static_cast<int32_t>(i));
    }
  }
  r.offsets[kE] = static_cast<int32_t>(r.rows.size());
  r.touched = 0;
  for (int e = 0; e < kE; ++e) r.touched += r.offsets[e + 1] > r.offsets[e];
}

void UploadRouting(int64_t T, Routing& r, uint64_t seed) {
  auto up = [](auto*& d, const auto& v) {
    using E = std::remove_reference_t<decltype(v[0])>;
    d = DevAlloc<std::remove_const_t<E>>(std::max<size_t>(v.size(), 1) * sizeof(E));
    if (!v.empty()) CK(cudaMemcpy(d, v.data(), v.size() * sizeof(E), cudaMemcpyHostToDevice));
  };
  up(r.d_ids, r.ids);
  up(r.d_w, r.w);
  up(r.d_rows, r.rows);
  up(r.d_pos, r.pos);
  r.d_x = DevAlloc<uint16_t>(T * kL * 2);
  bench::FillRandomBf16(r.d_x, T * kL, seed, nullptr);
}

void FreeRouting(Routing& r) {
  cudaFree(r.d_ids), cudaFree(r.d_w), cudaFree(r.d_rows), cudaFree(r.d_pos), cudaFree(r.d_x);
}

gpu::MoeExpertParams Params(const WeightSet& ws, const Routing& r, int64_t T, float* out, void* work,
                            size_t work_bytes) {
  gpu::MoeExpertParams p;
  p.experts = ws.dev;
  p.num_local_experts = kE;
  p.num_total_experts = kEAll;
  p.width = kL;
  p.inter = kI;
  p.num_tokens = T;
  p.top_k = kTopK;
  p.expert_ids = r.d_ids;
  p.weights = r.d_w;
  p.x = r.d_x;
  p.act_dtype = gpu::ActDType::kBF16;
  p.output_norm = true;
  p.eps = 1e-5f;
  p.out = out;
  p.workspace = work;
  p.workspace_bytes = work_bytes;
  p.expert_formats = kUseHint ? ws.hint : 0;
  return p;
}

// Host copy of one device matrix, as a host WeightRef (storage in `keep`).
WeightRef HostCopy(const WeightRef& d, std::vector<std::vector<uint8_t>>& keep) {
  keep.emplace_back(d.rows * d.row_stride_bytes);
  CK(cudaMemcpy(keep.back().data(), d.data, keep.back().size(), cudaMemcpyDeviceToHost));
  WeightRef h = d;
  h.data = keep.back().data();
  if (d.format != WeightFormat::kNVFP4) return h;
  keep.emplace_back(d.rows * d.scale_row_stride);
  CK(cudaMemcpy(keep.back().data(), d.scale, keep.back().size(), cudaMemcpyDeviceToHost));
  h.scale = keep.back().data();
  return h;
}

// Runs the kernel on fresh inputs and compares a sample of tokens with the CPU reference.
// Returns the worst relative L2 error of a row.
double Check(const WeightSet& ws, int64_t T, bool zipf, std::mt19937& rng, float* out, void* work, size_t work_bytes) {
  Routing r;
  MakeRouting(T, zipf, rng, r);
  UploadRouting(T, r, rng());
  gpu::MoeExpertParams p = Params(ws, r, T, out, work, work_bytes);
  CK(cudaMemset(out, 0xff, T * kL * 4));
  absl::Status st = gpu::MoeExpertStep(p, nullptr);
  if (!st.ok()) std::fprintf(stderr, "MoeExpertStep: %s\n", std::string(st.message()).c_str()), std::exit(1);
  CK(cudaDeviceSynchronize());
  std::vector<float> got(T * kL);
  CK(cudaMemcpy(got.data(), out, got.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<uint16_t> xb(T * kL);
  CK(cudaMemcpy(xb.data(), r.d_x, xb.size() * 2, cudaMemcpyDeviceToHost));
  // Sample: up to 5 tokens with a local expert, and 1 without.
  std::vector<int64_t> sample;
  int num_local = 0;
  bool have_empty = false;
  for (int64_t t = 0; t < T && sample.size() < 6; t += std::max<int64_t>(1, T / 97)) {
    bool local = false;
    for (int k = 0; k < kTopK; ++k) local |= r.ids[t * kTopK + k] >= 0;
    if (local && num_local < 5) sample.push_back(t), ++num_local;
    if (!local && !have_empty) sample.push_back(t), have_empty = true;
  }
  std::vector<std::vector<uint8_t>> keep;
  std::vector<MoeRefExpert> ref(kE);
  std::vector<int32_t> ids;
  std::vector<float> w, x;
  for (int64_t t : sample) {
    for (int k = 0; k < kTopK; ++k) {
      int32_t e = r.ids[t * kTopK + k];
      if (e >= 0 && !ref[e].gate.valid()) {
        ref[e] = {HostCopy(ws.host[e].gate, keep), HostCopy(ws.host[e].up, keep), HostCopy(ws.host[e].down, keep)};
      }
      ids.push_back(e);
      w.push_back(r.w[t * kTopK + k]);
    }
    for (int64_t i = 0; i < kL; ++i) x.push_back(Bf16ToF32(xb[t * kL + i]));
  }
  // Experts that no sampled token uses stay empty views; the reference never reads them.
  const int64_t n = static_cast<int64_t>(sample.size());
  std::vector<float> want(n * kL);
  MoeExpertRef(ref, kL, kI, n, kTopK, ids.data(), w.data(), x.data(), true, 1e-5f, want.data());
  double worst = 0;
  for (int64_t s = 0; s < n; ++s) {
    double ss = 0, se = 0;
    for (int64_t i = 0; i < kL; ++i) {
      const double g = got[sample[s] * kL + i], c = want[s * kL + i];
      ss += c * c;
      se += (g - c) * (g - c);
      if (std::isnan(g)) se = INFINITY;
    }
    worst = std::max(worst, ss > 0 ? std::sqrt(se / ss) : std::sqrt(se));
  }
  FreeRouting(r);
  return worst;
}

std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return v;
}

}  // namespace
}  // namespace moeshard

int main(int argc, char** argv) {
  using namespace moeshard;
  std::vector<int64_t> Ts = {1, 8, 64, 256, 753, 3012, 8192};
  bool ts_given = false, qwen = false;
  std::vector<bool> routings = {false, true};
  bool baseline = true, stages = false;
  int iters_override = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--t" && i + 1 < argc)
      Ts = ParseList(argv[++i]), ts_given = true;
    else if (a == "--format" && i + 1 < argc) {
      const std::string f = argv[++i];
      if (f == "q8_0") {
        kFormat = WeightFormat::kQ8_0;
      } else if (f == "mxfp4") {
        kFormat = WeightFormat::kMXFP4;
      } else if (f == "bf16") {
        kFormat = WeightFormat::kBF16;
      } else if (f == "nvfp4") {
        kFormat = WeightFormat::kNVFP4;
      } else {
        std::fprintf(stderr, "unknown --format %s\n", f.c_str());
        return 2;
      }
    } else if (a == "--shape" && i + 1 < argc) {
      const std::string sh = argv[++i];
      if (sh == "qwen30b") {
        qwen = true;
        kE = 128, kEAll = 128, kL = 2048, kI = 768;
      } else if (sh != "issue5") {
        std::fprintf(stderr, "unknown --shape %s\n", sh.c_str());
        return 2;
      }
    } else if (a == "--routing" && i + 1 < argc) {
      const std::string r = argv[++i];
      routings = r == "uniform" ? std::vector<bool>{false} : r == "zipf" ? std::vector<bool>{true} : routings;
    } else if (a == "--no-hint")
      kUseHint = false;
    else if (a == "--no-repack")
      kRepack = false;
    else if (a == "--skip-baseline")
      baseline = false;
    else if (a == "--stages")
      stages = true;
    else if (a == "--iters" && i + 1 < argc)
      iters_override = std::atoi(argv[++i]);
  }
  if (qwen && !ts_given) Ts = {1, 4, 8, 64, 4096};
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);

  // Ceilings: device-to-device copy (bytes read + written) and a large bf16 cuBLAS GEMM.
  double copy_gbs, gemm_tflops;
  {
    const size_t bytes = size_t{2} << 30;
    uint8_t *a = DevAlloc(bytes), *b = DevAlloc(bytes);
    bench::FillRandomBytes(a, bytes, 1, false, nullptr);
    double ms = TimeMs([&](int) { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice)); }, 3, 10);
    copy_gbs = 2.0 * bytes / ms / 1e6;
    cudaFree(a), cudaFree(b);
  }
  cublasHandle_t cb;
  CB(cublasCreate(&cb));
  {
    const int n = 8192;
    uint16_t *a = DevAlloc<uint16_t>(size_t{n} * n * 2), *b = DevAlloc<uint16_t>(size_t{n} * n * 2),
             *c = DevAlloc<uint16_t>(size_t{n} * n * 2);
    bench::FillRandomBf16(a, size_t{n} * n, 2, nullptr);
    bench::FillRandomBf16(b, size_t{n} * n, 3, nullptr);
    const float one = 1.f, zero = 0.f;
    double ms = TimeMs(
        [&](int) {
          CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n, &zero, c,
                          CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        },
        3, 10);
    gemm_tflops = 2.0 * n * n * double(n) / ms / 1e9;
    cudaFree(a), cudaFree(b), cudaFree(c);
  }
  std::printf("ceilings: copy %.0f GB/s (read + write), bf16 cuBLAS GEMM %.0f TFLOP/s\n", copy_gbs, gemm_tflops);

  // Weights: kSets sets of kE experts; kBaseSets of them also expanded to bf16.
  const bool nvfp4 = kFormat == WeightFormat::kNVFP4, mxfp4 = kFormat == WeightFormat::kMXFP4,
             q8 = kFormat == WeightFormat::kQ8_0;
  const size_t mat_bytes = kI * WeightRowBytes(kFormat, kL), scale_bytes = nvfp4 ? kI * kL / 16 : 0;
  std::printf("shape: E_local %d of %d, top-%d, L %ld, I %ld, format %s, hint %s, repack %s\n", kE, kEAll, kTopK,
              long(kL), long(kI), WeightFormatName(kFormat), kUseHint ? "on" : "off",
              kRepack && kUseHint && (nvfp4 || mxfp4 || q8) ? "on" : "off");
  std::vector<WeightSet> sets(kSets);
  for (int s = 0; s < kSets; ++s) {
    uint8_t* data = DevAlloc(3 * kE * mat_bytes);
    uint8_t* scale = nvfp4 ? DevAlloc(3 * kE * scale_bytes) : nullptr;
    bench::FillRandomBytes(data, 3 * kE * mat_bytes, 100 + s, false, nullptr);
    if (nvfp4) bench::FillRandomBytes(scale, 3 * kE * scale_bytes, 200 + s, true, nullptr);
    bench::SaneWeights(data, 3 * kE * mat_bytes, kFormat, nullptr);
    for (int e = 0; e < kE; ++e) {
      auto m = [&](int j) {
        return MatDev{data + (3 * e + j) * mat_bytes, nvfp4 ? scale + (3 * e + j) * scale_bytes : nullptr, 0.0072f};
      };
      sets[s].host.push_back({m(0).Ref(kI, kL), m(1).Ref(kI, kL), m(2).Ref(kL, kI)});
    }
    sets[s].hint = gpu::MoeExpertFormats(sets[s].host.data(), kE, kL, kI);
    std::vector<gpu::MoeExpertWeights> kernel_view = sets[s].host;
    if ((nvfp4 || mxfp4 || q8) && kRepack && kUseHint) {  // as the worker does at load (worker/gpu/expert_repack.h)
      const size_t rscale_bytes = size_t(kI) * kL / 16;
      uint8_t* rdata = DevAlloc(3 * kE * mat_bytes);
      uint8_t* rscale = DevAlloc(3 * kE * rscale_bytes);
      for (int e = 0; e < kE; ++e) {
        WeightRef* v[3] = {&kernel_view[e].gate, &kernel_view[e].up, &kernel_view[e].down};
        for (int j = 0; j < 3; ++j) {
          uint8_t* d = rdata + (3 * e + j) * mat_bytes;
          uint8_t* sc = rscale + (3 * e + j) * rscale_bytes;
          if (mxfp4) {
            auto ok = gpu::MoeMxfp4Repackable(v[j], 1, nullptr);
            if (!ok.ok() || !*ok) std::fprintf(stderr, "repack: MXFP4 scales out of range\n"), std::exit(1);
          }
          auto r = mxfp4 ? gpu::MoeRepackMxfp4(*v[j], d, sc, nullptr)
                   : q8  ? gpu::MoeRepackQ8(*v[j], d, sc, nullptr)
                         : gpu::MoeRepackNvfp4(*v[j], d, sc, nullptr);
          if (!r.ok()) std::fprintf(stderr, "repack: %s\n", std::string(r.status().message()).c_str()), std::exit(1);
          *v[j] = *r;
        }
      }
      // The repacked views are NVFP4-format views: the hint is theirs (as the worker's is).
      sets[s].hint = gpu::MoeExpertFormats(kernel_view.data(), kE, kL, kI) | gpu::kMoeNvfp4Repacked |
                     (mxfp4 ? gpu::kMoeMxfp4Repacked : 0u) | (q8 ? gpu::kMoeQ8Repacked : 0u);
    }
    sets[s].dev = DevAlloc<gpu::MoeExpertWeights>(sizeof(gpu::MoeExpertWeights) * kE);
    CK(cudaMemcpy(sets[s].dev, kernel_view.data(), sizeof(gpu::MoeExpertWeights) * kE, cudaMemcpyHostToDevice));
  }
  std::vector<std::vector<uint16_t*>> gu16(kBaseSets), dn16(kBaseSets);
  if (baseline) {
    for (int s = 0; s < kBaseSets; ++s) {
      for (int e = 0; e < kE; ++e) {
        uint16_t* gu = DevAlloc<uint16_t>(2 * kI * kL * 2);
        uint16_t* dn = DevAlloc<uint16_t>(kL * kI * 2);
        auto ex = [&](const WeightRef& w, uint16_t* o) {
          absl::Status st = gpu::ExpandWeights({w, o, 0, gpu::ActDType::kBF16}, nullptr);
          if (!st.ok()) std::fprintf(stderr, "expand: %s\n", std::string(st.message()).c_str()), std::exit(1);
        };
        ex(sets[s].host[e].gate, gu);
        ex(sets[s].host[e].up, gu + kI * kL);
        ex(sets[s].host[e].down, dn);
        gu16[s].push_back(gu);
        dn16[s].push_back(dn);
      }
    }
  }
  CK(cudaDeviceSynchronize());

  const int64_t t_max = *std::max_element(Ts.begin(), Ts.end());
  // With the format hint, room for the wgmma path's expanded weights (prefill sizes on Hopper).
  const size_t work_bytes = gpu::MoeExpertWorkspaceBytes(kE, kL, kI, t_max, kTopK, kUseHint ? sets[0].hint : 0);
  void* work = DevAlloc(work_bytes);
  float* out = DevAlloc<float>(t_max * kL * 4);
  uint16_t* b_xg = DevAlloc<uint16_t>(t_max * kTopK * kL * 2);
  uint16_t* b_gu = DevAlloc<uint16_t>(t_max * kTopK * 2 * kI * 2);
  uint16_t* b_h = DevAlloc<uint16_t>(t_max * kTopK * kI * 2);
  float* b_y = DevAlloc<float>(t_max * kTopK * kL * 4);
  std::mt19937 rng(12345);
  std::printf("\n%-8s %6s %6s %6s %10s %10s %10s %8s %7s %10s %7s %7s  %s\n", "routing", "T", "pairs", "experts",
              "time_us", "floor_us", "bytes_MB", "GFLOP", "ratio", "cublas_us", "GB/s", "check", "path");
  for (bool zipf : routings) {
    for (int64_t T : Ts) {
      const double err = Check(sets[0], T, zipf, rng, out, work, work_bytes);
      std::vector<Routing> rs(kSets);
      double bytes = 0, flops = 0, pairs = 0, touched = 0;
      for (int s = 0; s < kSets; ++s) {
        MakeRouting(T, zipf, rng, rs[s]);
        UploadRouting(T, rs[s], rng());
        bytes += rs[s].touched * 3.0 * (mat_bytes + scale_bytes) + T * kL * 2.0 + T * kL * 4.0;
        flops += 6.0 * kL * kI * rs[s].rows.size();
        pairs += rs[s].rows.size();
        touched += rs[s].touched;
      }
      bytes /= kSets, flops /= kSets, pairs /= kSets, touched /= kSets;
      const int iters = iters_override ? iters_override : T <= 256 ? 200 : T <= 3012 ? 60 : 20;
      const gpu::MoePathCounts before = gpu::MoeExpertPathCounts();
      const double ms = TimeMs(
          [&](int i) {
            gpu::MoeExpertParams p = Params(sets[i % kSets], rs[i % kSets], T, out, work, work_bytes);
            (void)gpu::MoeExpertStep(p, nullptr);
          },
          3, iters);
      const char* path = PathName(before, gpu::MoeExpertPathCounts());
      double base_ms = 0;
      if (baseline) {
        const float one = 1.f, zero = 0.f;
        base_ms = TimeMs(
            [&](int i) {
              const Routing& r = rs[i % kSets];
              const int ws = i % kBaseSets;
              const int64_t n = static_cast<int64_t>(r.rows.size());
              bench::GatherRows(r.d_x, r.d_rows, n, kTopK, kL, b_xg, nullptr);
              for (int e = 0; e < kE; ++e) {
                const int c = r.offsets[e + 1] - r.offsets[e];
                if (c == 0) continue;
                CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, 2 * kI, c, kL, &one, gu16[ws][e], CUDA_R_16BF, kL,
                                b_xg + int64_t{r.offsets[e]} * kL, CUDA_R_16BF, kL, &zero,
                                b_gu + int64_t{r.offsets[e]} * 2 * kI, CUDA_R_16BF, 2 * kI, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
              }
              bench::SiluMul(b_gu, n, kI, b_h, nullptr);
              for (int e = 0; e < kE; ++e) {
                const int c = r.offsets[e + 1] - r.offsets[e];
                if (c == 0) continue;
                CB(cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, kL, c, kI, &one, dn16[ws][e], CUDA_R_16BF, kI,
                                b_h + int64_t{r.offsets[e]} * kI, CUDA_R_16BF, kI, &zero,
                                b_y + int64_t{r.offsets[e]} * kL, CUDA_R_32F, kL, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
              }
              gpu::MoeWork w;
              w.pos = r.d_pos;
              w.y = b_y;
              gpu::MoeExpertParams p = Params(sets[0], r, T, out, work, work_bytes);
              CK(gpu::LaunchMoeCombine(p, w, nullptr));
            },
            2, iters);
      }
      std::string stage_line;
      if (stages) {  // each stage alone, on the workspace the previous runs left
        const char* names[] = {"route",  "gather", "fast_gu", "gen_gu", "fast_dn",
                               "gen_dn", "combine", "gemv_gu", "gemv_dn"};
        for (int b = 0; b < 9; ++b) {
          const double sm = TimeMs(
              [&](int i) {
                gpu::MoeExpertParams p = Params(sets[i % kSets], rs[i % kSets], T, out, work, work_bytes);
                CK(gpu::MoeExpertStepStages(p, 1u << b, nullptr));
              },
              2, std::max(iters / 2, 5));
          char buf[64];
          std::snprintf(buf, sizeof(buf), " %s %.1f", names[b], sm * 1e3);
          stage_line += buf;
        }
      }
      const double floor_us = std::max(bytes / copy_gbs / 1e3, flops / gemm_tflops / 1e6);
      std::printf("%-8s %6ld %6.0f %6.1f %10.1f %10.1f %10.1f %8.1f %7.2f %10.1f %7.0f %7.1e  %s\n",
                  zipf ? "zipf" : "uniform", long(T), pairs, touched, ms * 1e3, floor_us, bytes / 1e6, flops / 1e9,
                  ms * 1e3 / floor_us, base_ms * 1e3, bytes / ms / 1e6, err, path);
      if (stages) std::printf("    stages_us:%s\n", stage_line.c_str());
      std::fflush(stdout);
      for (auto& r : rs) FreeRouting(r);
    }
  }
  return 0;
}
