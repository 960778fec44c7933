// Paged attention against the CPU reference (kernels/cpu/ops.h Attention), every kernel the
// GPU backend has (reference, tiled, split decode, tensor-core prefill and decode): ragged batches
// with shuffled block tables, GQA, sliding windows, every KV element type (fp32, bf16, FP8 e4m3 with
// scales), long contexts, the test models' own shapes, and the FP8 prefill copy (PlanKvCopy +
// KvDequant). Part of the model_ops_test binary (fixture in model_ops_test_util.h); labelled `gpu`.
#include <cuda_runtime.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_check.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/model_ops_test_util.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gpu_ops.h"
#include "worker/kv_copy_plan.h"

namespace moeshard::ops_test {

// A paged attention scenario: sequences continuing at `start` with `n` new tokens each,
// their blocks shuffled in a pool; KV of every position written by KvWrite, this step's
// queries attended by Attention with each kernel in `algos`, each compared with the CPU
// reference (kernels/cpu/ops.h Attention). The output is poisoned (NaN) before each run.
struct AttnSeq {
  int64_t start, n;
};
struct AttnCase {
  std::vector<AttnSeq> seqs;
  int64_t nq = 8, nkv = 2, hd = 128, bs = 4, window = 0;
  gpu::KvElem elem = gpu::KvElem::kF32;
  std::vector<gpu::AttentionAlgo> algos;
  int64_t max_tokens_per_seq = 0;
  bool workspace = true;
  // FP8 only: also through the runner's FP8 prefill copy (PlanKvCopy + KvDequant): every copied
  // value equals the host's dequantization, and each kernel's output over the copy equals its
  // output over the FP8 cache (bit for bit for the tensor-core prefill kernel, whose FP8 tiles
  // hold the copy's values), else the CPU reference within the FP8 bound.
  bool via_copy = false;
};

// A case of these sequences, heads, block size, sliding window and cache element through `algos`.
AttnCase MakeCase(std::vector<AttnSeq> seqs, int64_t nq, int64_t nkv, int64_t hd, int64_t bs, int64_t window,
                  gpu::KvElem elem, std::vector<gpu::AttentionAlgo> algos) {
  AttnCase c;
  c.seqs = std::move(seqs);
  c.nq = nq;
  c.nkv = nkv;
  c.hd = hd;
  c.bs = bs;
  c.window = window;
  c.elem = elem;
  c.algos = std::move(algos);
  return c;
}

// An sm_90 device (the wgmma kernel's): there, every shape the kernel takes must run on it.
bool DeviceIsSm90() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
}

const char* AlgoName(gpu::AttentionAlgo a) {
  switch (a) {
    case gpu::AttentionAlgo::kAuto: return "auto";
    case gpu::AttentionAlgo::kReference: return "reference";
    case gpu::AttentionAlgo::kTiled: return "tiled";
    case gpu::AttentionAlgo::kSplitDecode: return "split-decode";
    case gpu::AttentionAlgo::kTiledTensorCore: return "tiled-tensor-core";
    case gpu::AttentionAlgo::kWgmma: return "wgmma";
  }
  return "?";
}

void ModelOpsTestRunAttention(const AttnCase& c, bool bf16, std::mt19937& rng) {
  const int64_t nq = c.nq, nkv = c.nkv, hd = c.hd, bs = c.bs;
  int64_t num_blocks = 0;
  for (const AttnSeq& s : c.seqs) num_blocks += (s.start + s.n + bs - 1) / bs;
  num_blocks += 3;  // unused blocks in the pool
  std::vector<int32_t> pool(num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<float> kref(num_blocks * bs * nkv * hd), vref(kref.size());
  std::vector<int32_t> tables, slots;
  std::vector<float> q_all, out_ref;
  int64_t next = 0;
  const size_t esz = c.elem == gpu::KvElem::kF32 ? 4 : c.elem == gpu::KvElem::kBF16 ? 2 : 1;
  Dev<uint8_t> kc(kref.size() * esz), vc(kref.size() * esz);
  Dev<float> ks(num_blocks * bs * nkv), vs(num_blocks * bs * nkv);
  gpu::KvCacheView cache{kc.get(), vc.get(), ks.get(), vs.get(), c.elem, bs, nkv, hd, num_blocks};
  std::vector<float> step_k, step_v;
  auto rnd = [&](size_t n) {
    auto v = Randn(n, rng);
    return bf16 ? RoundBf16(v) : v;
  };
  for (const AttnSeq& s : c.seqs) {
    const int64_t total = s.start + s.n, nb = (total + bs - 1) / bs;
    const int32_t off = static_cast<int32_t>(tables.size());
    for (int64_t b = 0; b < nb; ++b) tables.push_back(pool[next++]);
    auto kv_k = rnd(total * nkv * hd), kv_v = rnd(total * nkv * hd);
    for (int64_t p = 0; p < total; ++p) {
      const int64_t slot = static_cast<int64_t>(tables[off + p / bs]) * bs + p % bs;
      std::copy_n(kv_k.begin() + p * nkv * hd, nkv * hd, kref.begin() + slot * nkv * hd);
      std::copy_n(kv_v.begin() + p * nkv * hd, nkv * hd, vref.begin() + slot * nkv * hd);
      slots.push_back(static_cast<int32_t>(slot));
    }
    step_k.insert(step_k.end(), kv_k.begin(), kv_k.end());
    step_v.insert(step_v.end(), kv_v.begin(), kv_v.end());
  }
  {
    std::unique_ptr<Dev<float>> k32, v32;
    std::unique_ptr<Dev<uint16_t>> k16, v16;
    if (bf16) {
      k16 = std::make_unique<Dev<uint16_t>>(ToBf16(step_k));
      v16 = std::make_unique<Dev<uint16_t>>(ToBf16(step_v));
    } else {
      k32 = std::make_unique<Dev<float>>(step_k);
      v32 = std::make_unique<Dev<float>>(step_v);
    }
    Dev<int32_t> dslots(slots);
    gpu::KvWriteParams kw;
    kw.k = bf16 ? static_cast<const void*>(k16->get()) : static_cast<const void*>(k32->get());
    kw.v = bf16 ? static_cast<const void*>(v16->get()) : static_cast<const void*>(v32->get());
    kw.dtype = bf16 ? ActDType::kBF16 : ActDType::kF32;
    kw.num_tokens = static_cast<int64_t>(slots.size());
    kw.slots = dslots.get();
    kw.cache = cache;
    STATUS_OK(gpu::KvWrite(kw, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  std::vector<int32_t> qpos, qoff;
  int64_t off_seq = 0;
  for (const AttnSeq& s : c.seqs) {
    const int32_t off = static_cast<int32_t>(off_seq);
    off_seq += (s.start + s.n + bs - 1) / bs;
    auto q = rnd(s.n * nq * hd);
    std::vector<float> o(s.n * nq * hd);
    PagedKv kv{kref.data(), vref.data(), bs, tables.data() + off};
    Attention(q.data(), s.n, nq, nkv, hd, s.start, kv, c.window, o.data());
    q_all.insert(q_all.end(), q.begin(), q.end());
    out_ref.insert(out_ref.end(), o.begin(), o.end());
    for (int64_t i = 0; i < s.n; ++i) {
      qpos.push_back(static_cast<int32_t>(s.start + i));
      qoff.push_back(off);
    }
  }
  const int64_t T = static_cast<int64_t>(qpos.size());
  std::unique_ptr<Dev<float>> dq32, dout32;
  std::unique_ptr<Dev<uint16_t>> dq16, dout16;
  if (bf16) {
    dq16 = std::make_unique<Dev<uint16_t>>(ToBf16(q_all));
    dout16 = std::make_unique<Dev<uint16_t>>(T * nq * hd);
  } else {
    dq32 = std::make_unique<Dev<float>>(q_all);
    dout32 = std::make_unique<Dev<float>>(T * nq * hd);
  }
  void* out = bf16 ? static_cast<void*>(dout16->get()) : static_cast<void*>(dout32->get());
  const size_t out_bytes = T * nq * hd * (bf16 ? 2 : 4);
  Dev<int32_t> dpos(qpos), doff(qoff), dtab(tables);
  // A full workspace for decode batches; a small one (two splits) for the longer batches.
  const int64_t ws_bytes = gpu::AttentionWorkspaceBytes(T, nq, hd, T <= 8 ? gpu::kAttentionMaxSplits : 2);
  Dev<uint8_t> ws(c.workspace ? ws_bytes : 1);
  const double bound = c.elem == gpu::KvElem::kFp8E4M3                  ? 6e-2
                       : bf16 || c.elem == gpu::KvElem::kBF16 ? 1e-2
                                                                         : 2e-6;
  for (gpu::AttentionAlgo algo : c.algos) {
    if (algo == gpu::AttentionAlgo::kTiledTensorCore && (!bf16 || hd > 128)) continue;  // bf16 only
    // wgmma: bf16 activations over a bf16 cache, head_dim 64 or 128, group dividing 128 (the FP8
    // cases reach it through the copy, under kAuto).
    const bool wgmma_shape = bf16 && c.elem == gpu::KvElem::kBF16 && (hd == 64 || hd == 128) && 128 % (nq / nkv) == 0;
    if (algo == gpu::AttentionAlgo::kWgmma && !wgmma_shape) continue;
    gpu::AttentionParams ap;
    ap.q = bf16 ? static_cast<const void*>(dq16->get()) : static_cast<const void*>(dq32->get());
    ap.out = out;
    ap.dtype = bf16 ? ActDType::kBF16 : ActDType::kF32;
    ap.num_tokens = T;
    ap.num_heads = nq;
    ap.pos = dpos.get();
    ap.table_offset = doff.get();
    ap.block_tables = dtab.get();
    ap.window = c.window;
    ap.scale = 1.f / std::sqrt(static_cast<float>(hd));
    ap.cache = cache;
    ap.algo = algo;
    ap.max_tokens_per_seq = c.max_tokens_per_seq;
    if (c.workspace) {
      ap.workspace = ws.get();
      ap.workspace_bytes = ws_bytes;
    }
    if (algo == gpu::AttentionAlgo::kWgmma && !gpu::ResolveAttentionAlgo(ap).ok()) {
      ASSERT_FALSE(DeviceIsSm90()) << "the wgmma kernel refused a shape it takes on an sm_90 device";
      std::printf("[note] wgmma attention not run: not an sm_90 device (or a build without sm_90a)\n");
      continue;
    }
    ASSERT_EQ(cudaMemset(out, 0xff, out_bytes), cudaSuccess);  // NaN in fp32 and bf16
    STATUS_OK(gpu::Attention(ap, nullptr));
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> got = bf16 ? FromBf16(dout16->Host()) : dout32->Host();
    size_t nans = 0;
    for (float x : got) nans += std::isnan(x) ? 1 : 0;
    EXPECT_EQ(nans, 0u) << AlgoName(algo);
    EXPECT_LE(RelErr(got, out_ref), bound)
        << AlgoName(algo) << " window " << c.window << " kv elem " << static_cast<int>(c.elem) << " hd " << hd
        << " nq " << nq << " nkv " << nkv;
    if (!c.via_copy || c.elem != gpu::KvElem::kFp8E4M3) continue;
    std::vector<SeqChunk> chunks;
    int64_t toff_at = 0;
    for (const AttnSeq& s : c.seqs) {
      SeqChunk ch;
      ch.start_pos = s.start;
      ch.tokens.assign(s.n, 0);
      const int64_t nb = (s.start + s.n + bs - 1) / bs;
      ch.block_table.assign(tables.begin() + toff_at, tables.begin() + toff_at + nb);
      toff_at += nb;
      chunks.push_back(std::move(ch));
    }
    absl::StatusOr<KvCopyPlan> plan = PlanKvCopy(chunks, bs, c.window, false);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int64_t nblk = static_cast<int64_t>(plan->src_blocks.size()), per_block = bs * nkv * hd;
    Dev<int32_t> dsrc(plan->src_blocks), dctab(plan->tables), dctoff(plan->table_offset);
    Dev<uint16_t> ck(nblk * per_block), cv(nblk * per_block);
    gpu::KvDequantParams kp;
    kp.src = cache;
    kp.src_blocks = dsrc.get();
    kp.num_blocks = nblk;
    kp.k_out = ck.get();
    kp.v_out = cv.get();
    STATUS_OK(gpu::KvDequant(kp, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    {  // the copy against the host's e4m3 x scale, rounded to bf16
      const std::vector<uint8_t> k8 = kc.Host(), v8 = vc.Host();
      const std::vector<float> k_sc = ks.Host(), v_sc = vs.Host();
      const std::vector<uint16_t> gk = ck.Host(), gv = cv.Host();
      size_t bad = 0;
      for (int64_t i = 0; i < nblk; ++i) {
        for (int64_t e = 0; e < per_block; ++e) {
          const int64_t src = static_cast<int64_t>(plan->src_blocks[i]) * per_block + e;
          const int64_t sc = static_cast<int64_t>(plan->src_blocks[i]) * bs * nkv + e / hd;
          bad += gk[i * per_block + e] != F32ToBf16(E4M3ToF32Exact(k8[src]) * k_sc[sc]);
          bad += gv[i * per_block + e] != F32ToBf16(E4M3ToF32Exact(v8[src]) * v_sc[sc]);
        }
      }
      EXPECT_EQ(bad, 0u) << "KvDequant values differ from the host's";
    }
    gpu::AttentionParams cp = ap;
    cp.cache = gpu::KvCacheView{ck.get(), cv.get(), nullptr, nullptr, gpu::KvElem::kBF16, bs, nkv, hd, nblk};
    cp.block_tables = dctab.get();
    cp.table_offset = dctoff.get();
    ASSERT_EQ(cudaMemset(out, 0xff, out_bytes), cudaSuccess);
    STATUS_OK(gpu::Attention(cp, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> via = bf16 ? FromBf16(dout16->Host()) : dout32->Host();
    // The tensor-core prefill kernel over the copy reads the same bf16 tiles it converts from FP8
    // (under kAuto the copy may go to the wgmma kernel instead: compared with the reference).
    const bool same_tiles = bf16 && hd <= 128 && algo == gpu::AttentionAlgo::kTiledTensorCore;
    if (same_tiles) {
      EXPECT_EQ(std::memcmp(via.data(), got.data(), via.size() * 4), 0)
          << AlgoName(algo) << ": the copy's output differs from the FP8 cache's, hd " << hd << " window " << c.window;
    } else {
      EXPECT_LE(RelErr(via, out_ref), bound) << AlgoName(algo) << " over the copy, hd " << hd;
    }
  }
}

const std::vector<gpu::AttentionAlgo> kAllAttentionAlgos = {
    gpu::AttentionAlgo::kReference, gpu::AttentionAlgo::kTiled, gpu::AttentionAlgo::kSplitDecode,
    gpu::AttentionAlgo::kTiledTensorCore, gpu::AttentionAlgo::kWgmma, gpu::AttentionAlgo::kAuto};

// A ragged batch over a paged cache: three sequences continuing at different positions,
// their blocks shuffled in the pool; KV written by KvWrite, read by Attention (every kernel).
TEST_P(ModelOpsTest, PagedAttentionRaggedGqaWindowAllKvTypes) {
  for (int64_t window : {int64_t{0}, int64_t{5}}) {
    for (gpu::KvElem elem : {gpu::KvElem::kF32, gpu::KvElem::kBF16, gpu::KvElem::kFp8E4M3}) {
      AttnCase c;
      c.seqs = {{0, 13}, {21, 1}, {5, 6}};
      c.window = window;
      c.elem = elem;
      c.algos = kAllAttentionAlgos;
      ModelOpsTestRunAttention(c, bf16(), rng_);
    }
  }
}

// Long contexts through the tiled kernel: a 300-token chunk continuing at 2500, a fresh
// 200-token prompt and a short chunk, so tiles straddle sequences; GQA 8 and 3.
TEST_P(ModelOpsTest, PagedAttentionLongPrefillTiled) {
  for (int64_t hd : {int64_t{64}, int64_t{128}}) {
    for (int64_t window : {int64_t{0}, int64_t{64}}) {
      for (gpu::KvElem elem : {gpu::KvElem::kF32, gpu::KvElem::kBF16}) {
        AttnCase c;
        c.seqs = {{2500, 300}, {0, 200}, {100, 37}};
        c.nq = hd == 64 ? 12 : 16;
        c.nkv = hd == 64 ? 4 : 2;
        c.hd = hd;
        c.bs = 16;
        c.window = window;
        c.elem = elem;
        c.algos = {gpu::AttentionAlgo::kTiled, gpu::AttentionAlgo::kTiledTensorCore, gpu::AttentionAlgo::kWgmma,
                   gpu::AttentionAlgo::kAuto};
        ModelOpsTestRunAttention(c, bf16(), rng_);
      }
    }
  }
  AttnCase c;  // FP8 with a head_dim below its kernel width (96 in the 128 kernel)
  c.seqs = {{1000, 70}, {3, 9}};
  c.nq = 8;
  c.nkv = 1;
  c.hd = 96;
  c.bs = 16;
  c.window = 0;
  c.elem = gpu::KvElem::kFp8E4M3;
  c.algos = {gpu::AttentionAlgo::kTiled, gpu::AttentionAlgo::kTiledTensorCore, gpu::AttentionAlgo::kSplitDecode};
  c.via_copy = true;
  ModelOpsTestRunAttention(c, bf16(), rng_);
  for (int64_t window : {int64_t{0}, int64_t{64}}) {  // FP8 long prefill through the copy, head_dim 128
    AttnCase f;
    f.seqs = {{2500, 300}, {0, 200}, {100, 37}};
    f.nq = 16;
    f.nkv = 2;
    f.bs = 16;
    f.window = window;
    f.elem = gpu::KvElem::kFp8E4M3;
    f.algos = {gpu::AttentionAlgo::kTiledTensorCore, gpu::AttentionAlgo::kAuto};
    f.via_copy = true;
    ModelOpsTestRunAttention(f, bf16(), rng_);
  }
}

// Decode of 4 sequences at long and short contexts through the split-decode kernel (with
// and without workspace), and the tiled kernel on the same batch.
TEST_P(ModelOpsTest, PagedAttentionLongDecodeSplit) {
  for (int64_t hd : {int64_t{64}, int64_t{128}}) {
    for (int64_t window : {int64_t{0}, int64_t{64}}) {
      for (bool ws : {true, false}) {
        AttnCase c;
        c.seqs = {{2999, 1}, {0, 1}, {64, 1}, {2047, 1}};
        c.nq = hd == 64 ? 12 : 32;
        c.nkv = 4;
        c.hd = hd;
        c.bs = 16;
        c.window = window;
        c.elem = hd == 64 ? gpu::KvElem::kF32 : gpu::KvElem::kBF16;
        c.max_tokens_per_seq = 1;
        c.workspace = ws;
        c.algos = {gpu::AttentionAlgo::kSplitDecode, gpu::AttentionAlgo::kAuto};
        if (ws) c.algos.insert(c.algos.end(), {gpu::AttentionAlgo::kTiled, gpu::AttentionAlgo::kTiledTensorCore});
        ModelOpsTestRunAttention(c, bf16(), rng_);
      }
    }
  }
  AttnCase c;  // FP8, MHA (group 1)
  c.seqs = {{3000, 1}, {17, 1}};
  c.nq = 4;
  c.nkv = 4;
  c.hd = 128;
  c.bs = 16;
  c.elem = gpu::KvElem::kFp8E4M3;
  c.algos = {gpu::AttentionAlgo::kSplitDecode, gpu::AttentionAlgo::kTiled, gpu::AttentionAlgo::kTiledTensorCore};
  ModelOpsTestRunAttention(c, bf16(), rng_);
}

// head_dim 32 (below every tensor-core kernel's width: the 64-wide kernels zero-pad it) with a
// 64-token sliding window, the demo model's shape (models/muse-spark-demo: 8 / 2 heads): decode
// at the window's edge and past it, and a 50-token chunk continuing at 50, as `moeshard check`'s
// decode and batched runs step it.
TEST_P(ModelOpsTest, PagedAttentionHeadDim32Window) {
  for (int64_t window : {int64_t{0}, int64_t{64}}) {
    for (gpu::KvElem elem : {gpu::KvElem::kF32, gpu::KvElem::kBF16}) {
      AttnCase c = MakeCase({{63, 1}, {64, 1}, {70, 1}, {99, 1}}, 8, 2, 32, 16, window, elem,
                            {gpu::AttentionAlgo::kSplitDecode, gpu::AttentionAlgo::kTiled,
                             gpu::AttentionAlgo::kTiledTensorCore, gpu::AttentionAlgo::kAuto});
      c.max_tokens_per_seq = 1;
      ModelOpsTestRunAttention(c, bf16(), rng_);
      AttnCase b = c;
      b.seqs = {{50, 50}, {0, 24}};
      b.max_tokens_per_seq = 50;
      ModelOpsTestRunAttention(b, bf16(), rng_);
    }
  }
}

// A block size that is not a power of two (12 tokens): the kernels' slot lookup takes its
// division branch instead of the shift (attention_common.cuh PagedSlots). Prefill through every
// kernel, then decode at long and short contexts through the split kernels (tensor cores for
// bf16 and FP8 caches, the fp32 kernel for an fp32 cache).
TEST_P(ModelOpsTest, PagedAttentionBlockSizeNotPowerOfTwo) {
  for (gpu::KvElem elem : {gpu::KvElem::kF32, gpu::KvElem::kBF16, gpu::KvElem::kFp8E4M3}) {
    for (bool decode : {false, true}) {
      AttnCase c;
      c.seqs = decode ? std::vector<AttnSeq>{{4999, 1}, {0, 1}, {95, 1}} : std::vector<AttnSeq>{{500, 140}, {0, 37}, {11, 1}};
      c.nq = decode ? 32 : 16;
      c.nkv = decode ? 4 : 2;
      c.hd = 128;
      c.bs = 12;
      c.window = !decode && elem == gpu::KvElem::kBF16 ? 40 : 0;
      c.elem = elem;
      c.max_tokens_per_seq = decode ? 1 : c.max_tokens_per_seq;
      c.algos = decode ? std::vector<gpu::AttentionAlgo>{gpu::AttentionAlgo::kSplitDecode, gpu::AttentionAlgo::kAuto}
                       : kAllAttentionAlgos;
      ModelOpsTestRunAttention(c, bf16(), rng_);
    }
  }
}

// Decode at long contexts over bf16 and FP8 caches: with bf16 activations the split-decode
// kernel runs on the tensor cores — attention_decode_split.cu's per-warp rings, then
// attention_decode_tc.cu's kernel (SetAttentionDecodeSplitKernel): GQA 8 (half an m16 tile; an
// FP8 cache at GQA <= 8 takes the split kernel's transposed form), 16 (a full tile), 6 and 2,
// head_dim 128 and 64, a sliding window, sequences from 1 to 20,000
// keys, and one sequence over one KV head cut into the most splits.
TEST_P(ModelOpsTest, PagedAttentionDecodeLongContextBf16AndFp8) {
  struct Reset {
    ~Reset() { gpu::SetAttentionDecodeSplitKernel(-1); }
  } reset;
  for (int split_kernel : {1, 0}) {
    SCOPED_TRACE(split_kernel ? "attention_decode_split.cu" : "attention_decode_tc.cu");
    gpu::SetAttentionDecodeSplitKernel(split_kernel);
    for (gpu::KvElem elem : {gpu::KvElem::kBF16, gpu::KvElem::kFp8E4M3}) {
      for (int64_t window : {int64_t{0}, int64_t{300}}) {
        AttnCase c;
        c.seqs = {{19999, 1}, {0, 1}, {776, 1}, {4095, 1}};
        c.nq = 32;
        c.nkv = 4;
        c.hd = 128;
        c.bs = 16;
        c.window = window;
        c.elem = elem;
        c.max_tokens_per_seq = 1;
        c.algos = {gpu::AttentionAlgo::kSplitDecode, gpu::AttentionAlgo::kAuto};
        ModelOpsTestRunAttention(c, bf16(), rng_);
      }
      auto decode = [&](std::vector<AttnSeq> seqs, int64_t nq, int64_t nkv, int64_t hd,
                        std::vector<gpu::AttentionAlgo> algos) {
        AttnCase c;
        c.seqs = std::move(seqs);
        c.nq = nq;
        c.nkv = nkv;
        c.hd = hd;
        c.bs = 16;
        c.elem = elem;
        c.max_tokens_per_seq = 1;
        c.algos = std::move(algos);
        ModelOpsTestRunAttention(c, bf16(), rng_);
      };
      // Group 16, head_dim 64, one split's worth of keys and a long one.
      decode({{9000, 1}, {40, 1}}, 32, 2, 64, {gpu::AttentionAlgo::kSplitDecode});
      // Groups 6 and 2 (an FP8 cache takes the transposed form: part of its n8 tile padding),
      // head_dim 64 and 128, keys from kb and to ke off the 16-key grid.
      decode({{9000, 1}, {40, 1}, {3001, 1}}, 24, 4, 64, {gpu::AttentionAlgo::kSplitDecode});
      decode({{12345, 1}, {17, 1}}, 4, 2, 128, {gpu::AttentionAlgo::kSplitDecode, gpu::AttentionAlgo::kAuto});
      // One sequence, one KV head: every one of kAttentionMaxSplits splits holds keys.
      decode({{20000, 1}}, 8, 1, 128, {gpu::AttentionAlgo::kSplitDecode, gpu::AttentionAlgo::kAuto});
    }
  }
}

// The wgmma prefill kernel (attention_wgmma.cu) on the shapes it takes and around them: head_dim
// 64 and 128; 1, 2, 8 and 16 query heads per KV head (tiles of 128, 64, 16 and 8 tokens) and 3
// (refused: kAuto falls back); full and sliding windows; a fresh prompt longer than a key tile, a
// chunk continuing mid-block at 2500, a 129-token prompt, one-token and short chunks, so tiles
// straddle sequences and key tiles start off the block grid; 16-, 32- and 4-token blocks (the
// tensor-map boxes and the cp.async gather).
TEST_P(ModelOpsTest, PagedAttentionWgmmaPrefill) {
  if (!DeviceIsSm90()) GTEST_SKIP() << "the wgmma kernel runs on sm_90 devices only";
  struct Heads {
    int64_t nq, nkv;
  };
  for (int64_t hd : {int64_t{64}, int64_t{128}}) {
    for (Heads h : {Heads{16, 2}, Heads{4, 4}, Heads{32, 2}, Heads{6, 3}, Heads{12, 4}}) {
      for (int64_t window : {int64_t{0}, int64_t{100}}) {
        AttnCase c;
        c.seqs = {{0, 300}, {2500, 260}, {100, 37}, {7, 1}, {0, 129}};
        c.nq = h.nq;
        c.nkv = h.nkv;
        c.hd = hd;
        c.bs = 16;
        c.window = window;
        c.elem = gpu::KvElem::kBF16;
        c.algos = {gpu::AttentionAlgo::kWgmma, gpu::AttentionAlgo::kAuto};
        ModelOpsTestRunAttention(c, bf16(), rng_);
      }
    }
  }
  AttnCase c;  // 4-token blocks: every key tile gathers 32 blocks
  c.seqs = {{0, 200}, {61, 70}};
  c.nq = 16;
  c.nkv = 2;
  c.hd = 128;
  c.bs = 4;
  c.elem = gpu::KvElem::kBF16;
  c.algos = {gpu::AttentionAlgo::kWgmma};
  ModelOpsTestRunAttention(c, bf16(), rng_);
  for (int64_t hd : {int64_t{64}, int64_t{128}}) {  // 32-token blocks: two tensor-map boxes a block
    ModelOpsTestRunAttention(
        MakeCase({{0, 700}, {45, 90}, {1000, 3}}, 8, 1, hd, 32, 200, gpu::KvElem::kBF16, {gpu::AttentionAlgo::kWgmma}),
        bf16(), rng_);
  }
}

// The test models' own shapes (tests/testdata: head_dim 16 and the demo's 32, GQA 2 and 4, a
// 16- or 64-token sliding window, 16-token blocks): prefill chunks continuing past the window,
// a 33-token prompt, one-token decode steps before and after the window fills, each kernel
// (the tensor-core ones run head_dim 16/32 in their 64-wide instantiation).
TEST_P(ModelOpsTest, PagedAttentionTestModelShapes) {
  for (int64_t hd : {int64_t{16}, int64_t{32}}) {
    for (int64_t window : {int64_t{0}, int64_t{16}, int64_t{64}}) {
      for (gpu::KvElem elem : {gpu::KvElem::kF32, gpu::KvElem::kBF16, gpu::KvElem::kFp8E4M3}) {
        for (int64_t nq : {int64_t{4}, int64_t{8}}) {
          AttnCase c;
          c.nq = nq;
          c.nkv = 2;
          c.hd = hd;
          c.bs = 16;
          c.window = window;
          c.elem = elem;
          c.seqs = {{0, 33}, {9000, 40}, {70, 3}};
          c.algos = kAllAttentionAlgos;
          c.via_copy = true;
          ModelOpsTestRunAttention(c, bf16(), rng_);
          AttnCase d = c;
          d.seqs = {{35, 1}, {15, 1}, {16, 1}, {9255, 1}, {0, 1}, {64, 1}};
          d.max_tokens_per_seq = 1;
          ModelOpsTestRunAttention(d, bf16(), rng_);
        }
      }
    }
  }
}

// Timing only (no timed asserts): a 4096-token prefill of a Qwen3-30B-shaped layer (32 q
// heads, 4 KV heads, head_dim 128, bf16 cache) and a decode of 4 sequences at 4096 context,
// each kernel against the reference kernel's output.
TEST_P(ModelOpsTest, PagedAttentionTimingQwen3Shape) {
  const int64_t nq = 32, nkv = 4, hd = 128, bs = 16, ctx = 4096;
  const int64_t seqs_decode = 4;
  const int64_t num_blocks = (ctx / bs) * seqs_decode;
  const size_t cache_elems = num_blocks * bs * nkv * hd;
  Dev<uint16_t> kc(ToBf16(Randn(cache_elems, rng_))), vc(ToBf16(Randn(cache_elems, rng_)));
  gpu::KvCacheView cache{kc.get(), vc.get(), nullptr, nullptr, gpu::KvElem::kBF16, bs, nkv, hd};
  std::vector<int32_t> pool(num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng_);
  Dev<int32_t> dtab(pool);
  const size_t esz = bf16() ? 2 : 4;
  for (bool decode : {false, true}) {
    const int64_t T = decode ? seqs_decode : ctx;
    std::vector<int32_t> pos(T), toff(T);
    for (int64_t t = 0; t < T; ++t) {
      pos[t] = static_cast<int32_t>(decode ? ctx - 1 : t);
      toff[t] = static_cast<int32_t>(decode ? t * (ctx / bs) : 0);
    }
    Dev<int32_t> dpos(pos), doff(toff);
    auto qv = Randn(T * nq * hd, rng_);
    Dev<uint8_t> dq(T * nq * hd * esz), dout(T * nq * hd * esz), dref(T * nq * hd * esz);
    if (bf16()) {
      auto b = ToBf16(qv);
      cudaMemcpy(dq.get(), b.data(), b.size() * 2, cudaMemcpyHostToDevice);
    } else {
      cudaMemcpy(dq.get(), qv.data(), qv.size() * 4, cudaMemcpyHostToDevice);
    }
    const int64_t ws_bytes = gpu::AttentionWorkspaceBytes(decode ? T : 1, nq, hd, 64);  // prefill uses none
    Dev<uint8_t> ws(ws_bytes);
    gpu::AttentionParams ap;
    ap.q = dq.get();
    ap.dtype = GetParam();
    ap.num_tokens = T;
    ap.num_heads = nq;
    ap.pos = dpos.get();
    ap.table_offset = doff.get();
    ap.block_tables = dtab.get();
    ap.scale = 1.f / std::sqrt(static_cast<float>(hd));
    ap.cache = cache;
    ap.max_tokens_per_seq = decode ? 1 : T;
    ap.workspace = ws.get();
    std::vector<float> ref;
    auto host = [&](const Dev<uint8_t>& d) {
      auto raw = d.Host();
      std::vector<float> o(T * nq * hd);
      for (size_t i = 0; i < o.size(); ++i) {
        if (bf16()) {
          uint16_t h;
          std::memcpy(&h, raw.data() + 2 * i, 2);
          o[i] = Bf16ToF32(h);
        } else {
          std::memcpy(&o[i], raw.data() + 4 * i, 4);
        }
      }
      return o;
    };
    struct Variant {
      gpu::AttentionAlgo algo;
      const char* note;
      int64_t splits;  // workspace for this many splits (decode)
      bool no_pipe;    // MOESHARD_ATTN_TC_PIPELINE=0
    };
    using A = gpu::AttentionAlgo;
    std::vector<Variant> variants = {{A::kReference, "", 64, false}, {A::kTiled, "", 64, false}};
    if (bf16()) {
      variants.push_back({A::kTiledTensorCore, "", 64, false});
      variants.push_back({A::kTiledTensorCore, " no cp.async pipeline", 64, true});
      if (!decode && DeviceIsSm90()) variants.push_back({A::kWgmma, "", 64, false});
    }
    if (decode) {
      for (int64_t sp : {8, 16, 32}) variants.push_back({A::kSplitDecode, " capped splits", sp, false});
      variants.push_back({A::kSplitDecode, "", 64, false});
    }
    variants.push_back({A::kAuto, "", 64, false});
    for (const Variant& v : variants) {
      ap.algo = v.algo;
      ap.workspace_bytes = gpu::AttentionWorkspaceBytes(decode ? T : 1, nq, hd, v.splits);
      if (v.no_pipe) setenv("MOESHARD_ATTN_TC_PIPELINE", "0", 1);
      ap.out = v.algo == A::kReference ? dref.get() : dout.get();
      ASSERT_EQ(cudaMemset(ap.out, 0xff, T * nq * hd * esz), cudaSuccess);
      STATUS_OK(gpu::Attention(ap, nullptr));  // warm-up (and the checked output)
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (v.algo == A::kReference) {
        ref = host(dref);
      } else {
        EXPECT_LE(RelErr(host(dout), ref), bf16() ? 1e-2 : 2e-5) << AlgoName(v.algo) << v.note
                                                                  << (decode ? " decode" : " prefill");
      }
      const int reps = v.algo == A::kReference && !decode ? 2 : 20;
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      std::vector<float> ms;
      for (int r = 0; r < reps; ++r) {  // one call at a time: includes the host's launch cost
        cudaEventRecord(e0);
        STATUS_OK(gpu::Attention(ap, nullptr));
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        ms.push_back(t);
      }
      float queued = 0;  // reps calls back to back: the device time per call
      cudaEventRecord(e0);
      for (int r = 0; r < reps; ++r) STATUS_OK(gpu::Attention(ap, nullptr));
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      cudaEventElapsedTime(&queued, e0, e1);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      if (v.no_pipe) unsetenv("MOESHARD_ATTN_TC_PIPELINE");
      std::sort(ms.begin(), ms.end());
      auto resolved = gpu::ResolveAttentionAlgo(ap);
      const int64_t splits = v.algo == A::kSplitDecode || (decode && v.algo == A::kAuto) ? v.splits : 0;
      std::printf("[timing] %s %s %s(%s)%s%s: back-to-back %.1f us/call; one call at a time median %.1f us "
                  "(min %.1f), %d reps\n",
                  bf16() ? "bf16" : "f32", decode ? "decode 4 seqs x 4096 ctx" : "prefill 4096 tokens",
                  AlgoName(v.algo), resolved.ok() ? AlgoName(*resolved) : "?", v.note,
                  splits ? (" <=" + std::to_string(splits)).c_str() : "", 1000.0 * queued / reps,
                  1000.0 * ms[ms.size() / 2], 1000.0 * ms[0], reps);
    }
  }
}

}  // namespace moeshard::ops_test
