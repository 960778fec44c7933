// attention_bench: decode attention over a paged KV cache against the copy bandwidth measured
// in the same run (issues 14 and 19: "batched paged decode at >= 70 % of bandwidth", "FP8 KV
// read at full speed"). Qwen3-30B-A3B's attention shape (32 query heads, 4 KV heads,
// head_dim 128, 16-token blocks), one query token per sequence at position ctx - 1, every
// sequence's blocks shuffled over the pool.
//
//   attention_bench [--cases 1x4096,1x32768,1x131072,4x4096,64x4096,16x32768] [--kv bf16,fp8]
//                   [--iters 20] [--back-to-back 1] [--nq 32] [--nkv 4] [--hd 128]
//
// Per case (sequences x context) and KV type: median of CUDA-event-timed runs of gpu::Attention
// (kSplitDecode: the split kernel and its combine) — each run one call (the host's launch
// latency included: ~20 us at short contexts), or with --back-to-back N the mean of N calls
// queued together (the GPU's time alone, as in a CUDA graph), bytes = the K and V rows every sequence
// reads (+ FP8 scales), GB/s and the share of the device-to-device copy rate measured at start.
// MOESHARD_ATTN_TC_DECODE=0 in the environment times the fp32-FMA kernels instead of the tensor
// cores (attention_decode_tc.cu), MOESHARD_ATTN_SPLIT_KEYS=N the fewest keys per split (default
// 64), for A/Bs in one call.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/copy_rate.h"
#include "bench/cuda_exit.h"
#include "common/dtype.h"
#include "kernels/cuda/gpu_ops.h"

namespace moeshard {
namespace {


struct Case {
  int64_t seqs = 1, ctx = 4096;
};

// Fills `bytes` of device memory with a repeated host pattern of sane values: bf16 normals or
// FP8 e4m3 codes without the NaN codes (0x7f, 0xff).
void FillSane(void* dst, size_t bytes, bool fp8, std::mt19937& rng) {
  const size_t chunk = std::min<size_t>(bytes, size_t{64} << 20);
  std::vector<uint8_t> host(chunk);
  std::normal_distribution<float> nd;
  if (fp8) {
    std::uniform_int_distribution<int> ud(0, 255);
    for (auto& b : host) {
      int v = ud(rng);
      b = static_cast<uint8_t>((v & 0x7f) == 0x7f ? v - 1 : v);
    }
  } else {
    for (size_t i = 0; i + 1 < chunk; i += 2) {
      const uint16_t h = F32ToBf16(nd(rng));
      host[i] = static_cast<uint8_t>(h);
      host[i + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  for (size_t off = 0; off < bytes; off += chunk) {
    CK(cudaMemcpy(static_cast<uint8_t*>(dst) + off, host.data(), std::min(chunk, bytes - off), cudaMemcpyHostToDevice));
  }
}

int Main(int argc, char** argv) {
  std::vector<Case> cases = {{1, 4096}, {1, 32768}, {1, 131072}, {4, 4096}, {64, 4096}, {16, 32768}};
  std::vector<std::string> kvs = {"bf16", "fp8"};
  int iters = 20, back_to_back = 1;
  int64_t nq = 32, nkv = 4, hd = 128;
  const int64_t bs = 16;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    auto want_int = [&](int64_t& out) {
      if (!absl::SimpleAtoi(v, &out) || out < 1) {
        std::fprintf(stderr, "attention_bench: %s needs a positive number\n", a.c_str());
        std::exit(2);
      }
      ++i;
    };
    if (a == "--cases") {
      cases.clear();
      for (absl::string_view c : absl::StrSplit(v, ',')) {
        std::vector<std::string> p = absl::StrSplit(c, 'x');
        Case k;
        if (p.size() != 2 || !absl::SimpleAtoi(p[0], &k.seqs) || !absl::SimpleAtoi(p[1], &k.ctx) || k.seqs < 1 ||
            k.ctx < 1) {
          std::fprintf(stderr, "attention_bench: --cases is a list of SEQSxCTX (got '%s')\n", v);
          return 2;
        }
        cases.push_back(k);
      }
      ++i;
    } else if (a == "--kv") {
      kvs = absl::StrSplit(v, ',');
      for (const auto& k : kvs) {
        if (k != "bf16" && k != "fp8") {
          std::fprintf(stderr, "attention_bench: --kv takes bf16 and fp8\n");
          return 2;
        }
      }
      ++i;
    } else if (a == "--iters") {
      int64_t n = 0;
      want_int(n);
      iters = static_cast<int>(n);
    } else if (a == "--back-to-back") {
      int64_t n = 0;
      want_int(n);
      back_to_back = static_cast<int>(n);
    } else if (a == "--nq") {
      want_int(nq);
    } else if (a == "--nkv") {
      want_int(nkv);
    } else if (a == "--hd") {
      want_int(hd);
    } else {
      std::fprintf(stderr,
                   "usage: attention_bench [--cases 1x4096,64x4096] [--kv bf16,fp8] [--iters 20] [--back-to-back 1] "
                   "[--nq 32] [--nkv 4] [--hd 128]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "attention_bench: no CUDA device\n");
    return 77;
  }
  const char* tc = std::getenv("MOESHARD_ATTN_TC_DECODE");
  const char* split_keys = std::getenv("MOESHARD_ATTN_SPLIT_KEYS");
  const double copy = bench::CopyRate();
  std::printf(
      "attention_bench: %lld q heads, %lld KV heads, head_dim %lld, block %lld; copy %.0f GB/s; kernels: %s; fewest "
      "keys a split: %s; calls queued together: %d\n",
      static_cast<long long>(nq), static_cast<long long>(nkv), static_cast<long long>(hd), static_cast<long long>(bs),
      copy, tc && tc[0] == '0' ? "fp32 FMA (MOESHARD_ATTN_TC_DECODE=0)" : "default",
      split_keys ? split_keys : "64 (default)", back_to_back);
  std::printf("| sequences x context | KV | time | KV read | GB/s | of copy BW |\n|---|---|---|---|---|---|\n");
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    for (const std::string& kv : kvs) {
      const bool fp8 = kv == "fp8";
      const int64_t esz = fp8 ? 1 : 2;
      const int64_t per_seq_blocks = (c.ctx + bs - 1) / bs;
      const int64_t blocks = per_seq_blocks * c.seqs;
      const size_t cache_bytes = static_cast<size_t>(blocks * bs * nkv * hd * esz);
      void *k = nullptr, *v = nullptr;
      float *ks = nullptr, *vs = nullptr;
      CK(cudaMalloc(&k, cache_bytes));
      CK(cudaMalloc(&v, cache_bytes));
      FillSane(k, cache_bytes, fp8, rng);
      FillSane(v, cache_bytes, fp8, rng);
      if (fp8) {
        const size_t sb = static_cast<size_t>(blocks * bs * nkv) * 4;
        CK(cudaMalloc(&ks, sb));
        CK(cudaMalloc(&vs, sb));
        std::vector<float> s(sb / 4, 1.f / 64);
        CK(cudaMemcpy(ks, s.data(), sb, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(vs, s.data(), sb, cudaMemcpyHostToDevice));
      }
      std::vector<int32_t> pool(blocks);
      std::iota(pool.begin(), pool.end(), 0);
      std::shuffle(pool.begin(), pool.end(), rng);
      std::vector<int32_t> pos(c.seqs, static_cast<int32_t>(c.ctx - 1)), off(c.seqs);
      for (int64_t s = 0; s < c.seqs; ++s) off[s] = static_cast<int32_t>(s * per_seq_blocks);
      std::vector<uint16_t> q(c.seqs * nq * hd);
      std::normal_distribution<float> nd;
      for (auto& x : q) x = F32ToBf16(nd(rng));
      void *dq = nullptr, *dout = nullptr, *dws = nullptr;
      int32_t *dpos = nullptr, *doff = nullptr, *dtab = nullptr;
      const int64_t ws_bytes = gpu::AttentionWorkspaceBytes(c.seqs, nq, hd, gpu::kAttentionMaxSplits);  // as the runners
      CK(cudaMalloc(&dq, q.size() * 2));
      CK(cudaMalloc(&dout, q.size() * 2));
      CK(cudaMalloc(&dws, ws_bytes));
      CK(cudaMalloc(&dpos, c.seqs * 4));
      CK(cudaMalloc(&doff, c.seqs * 4));
      CK(cudaMalloc(&dtab, blocks * 4));
      CK(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dpos, pos.data(), c.seqs * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(doff, off.data(), c.seqs * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dtab, pool.data(), blocks * 4, cudaMemcpyHostToDevice));
      gpu::AttentionParams ap;
      ap.q = dq;
      ap.out = dout;
      ap.dtype = gpu::ActDType::kBF16;
      ap.num_tokens = c.seqs;
      ap.num_heads = nq;
      ap.pos = dpos;
      ap.table_offset = doff;
      ap.block_tables = dtab;
      ap.scale = 1.f / std::sqrt(static_cast<float>(hd));
      ap.cache = gpu::KvCacheView{k, v, ks, vs, fp8 ? gpu::KvElem::kFp8E4M3 : gpu::KvElem::kBF16, bs, nkv, hd, blocks};
      ap.algo = gpu::AttentionAlgo::kSplitDecode;
      ap.max_tokens_per_seq = 1;
      ap.workspace = dws;
      ap.workspace_bytes = ws_bytes;
      cudaEvent_t e0, e1;
      CK(cudaEventCreate(&e0));
      CK(cudaEventCreate(&e1));
      std::vector<float> ms;
      for (int it = 0; it < iters + 3; ++it) {
        CK(cudaEventRecord(e0));
        for (int b = 0; b < back_to_back; ++b) {
          const absl::Status st = gpu::Attention(ap, nullptr);
          if (!st.ok()) {
            std::fprintf(stderr, "attention_bench: %s\n", st.ToString().c_str());
            return 1;
          }
        }
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t = 0;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (it >= 3) ms.push_back(t / back_to_back);
      }
      std::sort(ms.begin(), ms.end());
      const double sec = ms[ms.size() / 2] * 1e-3;
      const double bytes = 2.0 * c.seqs * c.ctx * nkv * (hd * esz + (fp8 ? 4 : 0));
      std::printf("| %lld x %lld | %s | %.1f us | %.1f MB | %.0f | %.0f %% |\n", static_cast<long long>(c.seqs),
                  static_cast<long long>(c.ctx), kv.c_str(), sec * 1e6, bytes / 1e6, bytes / sec / 1e9,
                  100.0 * bytes / sec / 1e9 / copy);
      for (void* p : {k, v, static_cast<void*>(ks), static_cast<void*>(vs), dq, dout, dws, static_cast<void*>(dpos),
                      static_cast<void*>(doff), static_cast<void*>(dtab)}) {
        if (p) CK(cudaFree(p));
      }
      CK(cudaEventDestroy(e0));
      CK(cudaEventDestroy(e1));
    }
  }
  return 0;
}

}  // namespace
}  // namespace moeshard

int main(int argc, char** argv) { return moeshard::Main(argc, argv); }
