// Op-consistency cases for the model's per-token CUDA ops (kernels/cuda/gpu_ops.h) and the
// cuBLAS projections (kernels/cuda/gemm.h), each against its CPU reference in kernels/cpu
// (or, for the few elementwise steps the CPU runner does inline, the same loop here), in
// fp32 (tight: 2e-6 relative) and bf16 (inputs/outputs rounded to bf16: 1e-2 relative).
// The paged attention case covers a ragged batch of sequences with shuffled block tables,
// GQA, a sliding window and every KV element type (fp32, bf16, FP8 e4m3 with scales).
// Labelled `gpu`; exits 77 (SKIPPED) where no CUDA device is present.
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
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_check.h"
#include "tests/kernels/gpu_test_util.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gpu_ops.h"
#include "worker/kv_copy_plan.h"

namespace moeshard {
namespace {

using gpu::ActDType;


// Device copy of a host vector, freed on scope exit.
template <typename T>
class Dev {
 public:
  explicit Dev(const std::vector<T>& h) : n_(h.size()) {
    cudaMalloc(&p_, std::max<size_t>(1, n_ * sizeof(T)));
    if (n_) cudaMemcpy(p_, h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice);
  }
  explicit Dev(size_t n) : Dev(std::vector<T>(n)) {}
  ~Dev() { cudaFree(p_); }
  T* get() const { return p_; }
  std::vector<T> Host() const {
    std::vector<T> h(n_);
    cudaDeviceSynchronize();
    cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

std::vector<float> Randn(size_t n, std::mt19937& rng, float sd = 1.f) {
  std::normal_distribution<float> d(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = F32ToBf16(v[i]);
  return o;
}
std::vector<float> FromBf16(const std::vector<uint16_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = Bf16ToF32(v[i]);
  return o;
}
std::vector<float> RoundBf16(const std::vector<float>& v) { return FromBf16(ToBf16(v)); }

// max |a - b| / max(1, max |b|): the error relative to the output's scale.
double RelErr(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 1, e = 0;
  for (float x : b) m = std::max<double>(m, std::fabs(x));
  for (size_t i = 0; i < a.size(); ++i) e = std::max<double>(e, std::fabs(a[i] - b[i]));
  return a.size() == b.size() ? e / m : 1e30;
}

class ModelOpsTest : public ::testing::TestWithParam<ActDType> {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  }
  bool bf16() const { return GetParam() == ActDType::kBF16; }
  double tol() const { return bf16() ? 1e-2 : 2e-6; }
  // Activations of the test's dtype on the device, and the values the reference sees.
  struct Act {
    std::unique_ptr<Dev<float>> f;
    std::unique_ptr<Dev<uint16_t>> b;
    std::vector<float> ref;
    void* get() const { return f ? static_cast<void*>(f->get()) : static_cast<void*>(b->get()); }
    std::vector<float> Host() const { return f ? f->Host() : FromBf16(b->Host()); }
  };
  Act MakeAct(const std::vector<float>& v) const {
    Act a;
    if (bf16()) {
      a.b = std::make_unique<Dev<uint16_t>>(ToBf16(v));
      a.ref = RoundBf16(v);
    } else {
      a.f = std::make_unique<Dev<float>>(v);
      a.ref = v;
    }
    return a;
  }
  std::mt19937 rng_{1234};
};

TEST_P(ModelOpsTest, RmsNormWithGatherAndSecondOutput) {
  const int64_t rows = 37, D = 200;
  auto x = MakeAct(Randn(rows * D, rng_, 3.f));
  auto w = Randn(D, rng_);
  std::vector<int32_t> idx(rows / 2);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>((i * 7) % rows);
  Dev<float> dw(w);
  Dev<int32_t> didx(idx);
  auto out = MakeAct(std::vector<float>(idx.size() * D));
  Dev<float> out32(idx.size() * D);
  gpu::RmsNormParams p;
  p.x = x.get();
  p.x_dtype = GetParam();
  p.row_index = didx.get();
  p.rows = static_cast<int64_t>(idx.size());
  p.dim = D;
  p.weight = dw.get();
  p.eps = 1e-5f;
  p.out = out.get();
  p.out_dtype = GetParam();
  p.out_f32 = out32.get();
  STATUS_OK(gpu::RmsNorm(p, nullptr));
  std::vector<float> gathered, ref(idx.size() * D);
  for (int32_t r : idx) gathered.insert(gathered.end(), x.ref.begin() + r * D, x.ref.begin() + (r + 1) * D);
  RmsNorm(gathered.data(), p.rows, D, w.data(), 1e-5f, ref.data());
  EXPECT_LE(RelErr(out.Host(), ref), tol());
  EXPECT_LE(RelErr(out32.Host(), ref), 2e-6);  // the fp32 copy is never rounded
}

TEST_P(ModelOpsTest, RopeNeoxAtRaggedPositions) {
  const int64_t T = 9, heads = 3, hd = 64;
  auto x = MakeAct(Randn(T * heads * hd, rng_));
  std::vector<int32_t> pos = {0, 1, 2, 50, 51, 7, 1000, 4095, 3};
  Dev<int32_t> dpos(pos);
  gpu::RopeParams p;
  p.x = x.get();
  p.dtype = GetParam();
  p.num_tokens = T;
  p.heads = heads;
  p.head_dim = hd;
  p.pos = dpos.get();
  p.theta = 1e6;
  STATUS_OK(gpu::Rope(p, nullptr));
  std::vector<float> ref = x.ref;
  RopeNeox(ref.data(), T, heads, hd, pos.data(), 1e6);
  EXPECT_LE(RelErr(x.Host(), ref), bf16() ? 1e-2 : 1e-5);
}

// The residual update on the CPU: s + out, or Muse Spark's alpha * s + beta * rmsnorm(out) * norm.
std::vector<float> ResidualRef(std::vector<float> s, std::vector<float> out, const std::vector<float>& norm,
                               const std::vector<float>& alpha, const std::vector<float>& beta, int64_t rows,
                               int64_t D, bool gated) {
  if (gated) RmsNorm(out.data(), rows, D, norm.data(), 1e-6f, out.data());
  for (int64_t i = 0; i < rows * D; ++i) s[i] = gated ? alpha[i % D] * s[i] + beta[i % D] * out[i] : s[i] + out[i];
  return s;
}

TEST_P(ModelOpsTest, ResidualPlainAndGated) {
  // Widths for each kernel: 98 (not a multiple of 4: the loop kernel), 96 and 2048 (rows in
  // registers, 1-2 pieces a thread), 4100 (5 pieces: registers when plain, the loop when gated)
  // and 8192 (8 pieces); each with the next block's fused norm (fp32 copy too) and without.
  const int64_t rows = 3;
  for (int64_t D : {int64_t{98}, int64_t{96}, int64_t{2048}, int64_t{4100}, int64_t{8192}}) {
    for (bool gated : {false, true}) {
      for (bool next : {false, true}) {
        SCOPED_TRACE(testing::Message() << "D " << D << " gated " << gated << " next " << next);
        auto s = Randn(rows * D, rng_), out = Randn(rows * D, rng_, 2.f), norm = Randn(D, rng_),
             alpha = Randn(D, rng_), beta = Randn(D, rng_), nn = Randn(D, rng_);
        Dev<float> ds(s), dout(out), dn(norm), da(alpha), db(beta), dnn(nn), d32(rows * D);
        auto xn = MakeAct(std::vector<float>(rows * D));
        gpu::ResidualParams p{ds.get(), dout.get(), rows, D, gated, dn.get(), da.get(), db.get(), 1e-6f};
        if (next) {
          p.next_norm = dnn.get();
          p.next_out = xn.get();
          p.next_dtype = GetParam();
          p.next_out_f32 = d32.get();
        }
        STATUS_OK(gpu::Residual(p, nullptr));
        const std::vector<float> ref = ResidualRef(s, out, norm, alpha, beta, rows, D, gated);
        EXPECT_LE(RelErr(ds.Host(), ref), 2e-6);
        if (next) {
          std::vector<float> want(rows * D);
          RmsNorm(ref.data(), rows, D, nn.data(), 1e-6f, want.data());
          EXPECT_LE(RelErr(d32.Host(), want), 2e-6);
          EXPECT_LE(RelErr(xn.Host(), want), tol());
        }
      }
    }
  }
}

// The MoE combine inside the update (ResidualParams::mix_*): each row's output is its slots'
// rows weighted in slot order, a slot at position -1 left out.
TEST_P(ModelOpsTest, ResidualMixesExpertRows) {
  const int64_t rows = 3, k = 8, nrows = 20;
  for (int64_t D : {int64_t{98}, int64_t{2048}}) {
    for (bool gated : {false, true}) {
      SCOPED_TRACE(testing::Message() << "D " << D << " gated " << gated);
      auto s = Randn(rows * D, rng_), y = Randn(nrows * D, rng_, 2.f), wts = Randn(rows * k, rng_),
           norm = Randn(D, rng_), alpha = Randn(D, rng_), beta = Randn(D, rng_);
      std::vector<int32_t> pos(rows * k);
      for (int64_t i = 0; i < rows * k; ++i) pos[i] = i % 5 == 3 ? -1 : static_cast<int32_t>((i * 7) % nrows);
      Dev<float> ds(s), dy(y), dw(wts), dn(norm), da(alpha), db(beta);
      Dev<int32_t> dp(pos);
      gpu::ResidualParams p{ds.get(), nullptr, rows, D, gated, dn.get(), da.get(), db.get(), 1e-6f};
      p.mix_rows = dy.get();
      p.mix_pos = dp.get();
      p.mix_weights = dw.get();
      p.mix_k = static_cast<int>(k);
      STATUS_OK(gpu::Residual(p, nullptr));
      std::vector<float> o(rows * D, 0.f), ref;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t j = 0; j < k; ++j) {
          const int32_t at = pos[r * k + j];
          if (at < 0) continue;
          for (int64_t i = 0; i < D; ++i) o[r * D + i] += wts[r * k + j] * y[at * D + i];
        }
      }
      ref = ResidualRef(s, o, norm, alpha, beta, rows, D, gated);
      EXPECT_LE(RelErr(ds.Host(), ref), 2e-6);
    }
  }
  gpu::ResidualParams bad{nullptr, nullptr, 1, 8, false};
  Dev<float> ds(8);
  bad.s = ds.get();
  EXPECT_FALSE(gpu::Residual(bad, nullptr).ok());  // neither out nor mixed rows
}

TEST_P(ModelOpsTest, ElementwiseSiluMulHeadGateBiasConvert) {
  const int64_t T = 6, heads = 4, hd = 32, n = T * heads * hd;
  auto g = MakeAct(Randn(n, rng_, 2.f)), u = MakeAct(Randn(n, rng_));
  auto o = MakeAct(Randn(n, rng_)), gate = MakeAct(Randn(T * heads, rng_, 3.f));
  auto out = MakeAct(std::vector<float>(n));
  STATUS_OK(gpu::SiluMul({g.get(), u.get(), out.get(), GetParam(), n}, nullptr));
  gpu::HeadGateParams hg{o.get(), gate.get(), GetParam(), T, heads, hd};
  STATUS_OK(gpu::HeadGate(hg, nullptr));
  std::vector<float> ref_silu(n), ref_gate(n);
  for (int64_t i = 0; i < n; ++i) {
    ref_silu[i] = g.ref[i] / (1.f + std::exp(-g.ref[i])) * u.ref[i];
    ref_gate[i] = o.ref[i] / (1.f + std::exp(-gate.ref[i / hd]));
  }
  EXPECT_LE(RelErr(out.Host(), ref_silu), tol());
  EXPECT_LE(RelErr(o.Host(), ref_gate), tol());
  auto bias = Randn(heads * hd, rng_);
  Dev<float> db(bias);
  STATUS_OK(gpu::AddBias({u.get(), GetParam(), db.get(), T, heads * hd}, nullptr));
  std::vector<float> ref_bias = u.ref;
  for (int64_t i = 0; i < n; ++i) ref_bias[i] += bias[i % (heads * hd)];
  EXPECT_LE(RelErr(u.Host(), ref_bias), tol());
  auto f = Randn(n, rng_);
  Dev<float> df(f);
  auto conv = MakeAct(std::vector<float>(n));
  STATUS_OK(gpu::Convert({df.get(), ActDType::kF32, conv.get(), GetParam(), n}, nullptr));
  EXPECT_EQ(conv.Host(), bf16() ? RoundBf16(f) : f);  // round to nearest even, bit for bit
}

TEST_P(ModelOpsTest, CublasProjectionMatchesCpuMatMul) {
  const int64_t T = 19, N = 72, K = 160;
  auto x = MakeAct(Randn(T * K, rng_));
  auto wv = Randn(N * K, rng_, 0.1f);
  auto w = MakeAct(wv);
  auto ws = ToBf16(wv);
  for (ActDType out_dtype : {ActDType::kF32, GetParam()}) {
    auto y = MakeAct(std::vector<float>(T * N));
    Dev<float> y32(T * N);
    auto st = gpu::Gemm::Create(nullptr);
    ASSERT_TRUE(st.ok()) << st.status();
    gpu::GemmArgs a;
    a.w = {w.get(), GetParam(), N, K};
    a.x = x.get();
    a.x_dtype = GetParam();
    a.y = out_dtype == ActDType::kF32 ? static_cast<void*>(y32.get()) : y.get();
    a.y_dtype = out_dtype;
    a.num_tokens = T;
    STATUS_OK((*st)->Run(a));
    WeightRef ref_w;
    ref_w.format = WeightFormat::kF32;
    ref_w.rows = N;
    ref_w.cols = K;
    ref_w.data = reinterpret_cast<const uint8_t*>(w.ref.data());
    ref_w.row_stride_bytes = K * 4;
    std::vector<float> ref(T * N);
    MatMul(x.ref.data(), T, ref_w, ref.data());
    auto got = out_dtype == ActDType::kF32 ? y32.Host() : y.Host();
    EXPECT_LE(RelErr(got, ref), bf16() ? 1e-2 : 2e-6);
  }
}

TEST_P(ModelOpsTest, RoutingBothSoftmaxModes) {
  // E = 24, 64, 256 and 320 take the warp-per-token kernel (4, 8 and 16 logits a lane), 600 the
  // thread-per-token fallback; top-k up to 8 and the 32 maximum.
  struct Shape {
    int64_t T, E, k;
  };
  for (const Shape sh : {Shape{33, 24, 4}, Shape{37, 256, 8}, Shape{5, 64, 32}, Shape{6, 320, 8}, Shape{9, 600, 8}}) {
    const int64_t T = sh.T, E = sh.E, k = sh.k;
    SCOPED_TRACE(testing::Message() << "T " << T << " E " << E << " k " << k);
    auto logits = Randn(T * E, rng_, 2.f);
    logits[5] = logits[6];            // a tie: the lower index wins
    logits[E + 40 % E] = logits[E + 3];  // another, across lanes
    Dev<float> dl(logits);
    const int64_t begin = E / 3, nloc = E / 3;
    for (bool topk_only : {false, true}) {
      for (bool renorm : {false, true}) {
        Dev<int32_t> ids(T * k), gids(T * k);
        Dev<float> w(T * k);
        gpu::RoutingParams p;
        p.logits = dl.get();
        p.num_tokens = T;
        p.num_experts = E;
        p.top_k = k;
        p.softmax_topk_only = topk_only;
        p.renormalize = renorm;
        p.expert_begin = begin;
        p.num_local_experts = nloc;
        p.local_ids = ids.get();
        p.weights = w.get();
        p.global_ids = gids.get();
        STATUS_OK(gpu::Routing(p, nullptr));
        std::vector<int32_t> rid(T * k);
        std::vector<float> rw(T * k);
        TopKRouting(logits.data(), T, E, k, topk_only, renorm, rid.data(), rw.data());
        EXPECT_EQ(gids.Host(), rid);
        EXPECT_LE(RelErr(w.Host(), rw), 1e-6);
        auto local = ids.Host();
        for (int64_t i = 0; i < T * k; ++i) {
          EXPECT_EQ(local[i], rid[i] >= begin && rid[i] < begin + nloc ? rid[i] - begin : -1);
        }
      }
    }
  }
  const int64_t E = 24;
  Dev<float> dl(Randn(E, rng_, 1.f));
  Dev<int32_t> ids(1);
  Dev<float> w(1);
  gpu::RoutingParams bad{dl.get(), 1, E, E + 1, false, false, 0, E, ids.get(), w.get(), nullptr};
  EXPECT_FALSE(gpu::Routing(bad, nullptr).ok());
}

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

const char* AlgoName(gpu::AttentionAlgo a) {
  switch (a) {
    case gpu::AttentionAlgo::kAuto: return "auto";
    case gpu::AttentionAlgo::kReference: return "reference";
    case gpu::AttentionAlgo::kTiled: return "tiled";
    case gpu::AttentionAlgo::kSplitDecode: return "split-decode";
    case gpu::AttentionAlgo::kTiledTensorCore: return "tiled-tensor-core";
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
  gpu::KvCacheView cache{kc.get(), vc.get(), ks.get(), vs.get(), c.elem, bs, nkv, hd};
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
  const int64_t ws_bytes = gpu::AttentionWorkspaceBytes(T, nq, hd, T <= 8 ? 64 : 2);
  Dev<uint8_t> ws(c.workspace ? ws_bytes : 1);
  const double bound = c.elem == gpu::KvElem::kFp8E4M3                  ? 6e-2
                       : bf16 || c.elem == gpu::KvElem::kBF16 ? 1e-2
                                                                         : 2e-6;
  for (gpu::AttentionAlgo algo : c.algos) {
    if (algo == gpu::AttentionAlgo::kTiledTensorCore && (!bf16 || hd > 128)) continue;  // bf16 only
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
    cp.cache = gpu::KvCacheView{ck.get(), cv.get(), nullptr, nullptr, gpu::KvElem::kBF16, bs, nkv, hd};
    cp.block_tables = dctab.get();
    cp.table_offset = dctoff.get();
    ASSERT_EQ(cudaMemset(out, 0xff, out_bytes), cudaSuccess);
    STATUS_OK(gpu::Attention(cp, nullptr));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> via = bf16 ? FromBf16(dout16->Host()) : dout32->Host();
    const bool same_tiles = bf16 && hd <= 128 &&
                            (algo == gpu::AttentionAlgo::kTiledTensorCore ||
                             (algo == gpu::AttentionAlgo::kAuto && c.max_tokens_per_seq == 0 && T > 8));
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
    gpu::AttentionAlgo::kTiledTensorCore, gpu::AttentionAlgo::kAuto};

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
        c.algos = {gpu::AttentionAlgo::kTiled, gpu::AttentionAlgo::kTiledTensorCore, gpu::AttentionAlgo::kAuto};
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

// Decode at long contexts over bf16 and FP8 caches: with bf16 activations the split-decode
// kernel runs on the tensor cores (attention_decode_tc.cu): GQA 8 (half an m16 tile) and 16
// (a full tile), head_dim 128 and 64, a sliding window, sequences from 1 to 20,000 keys.
TEST_P(ModelOpsTest, PagedAttentionDecodeLongContextBf16AndFp8) {
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
    AttnCase c;  // group 16, head_dim 64, one split's worth of keys and a long one
    c.seqs = {{9000, 1}, {40, 1}};
    c.nq = 32;
    c.nkv = 2;
    c.hd = 64;
    c.bs = 16;
    c.elem = elem;
    c.max_tokens_per_seq = 1;
    c.algos = {gpu::AttentionAlgo::kSplitDecode};
    ModelOpsTestRunAttention(c, bf16(), rng_);
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

TEST_P(ModelOpsTest, EmbedDecodesStoredRows) {
  const int64_t V = 50, H = 64;
  auto table = Randn(V * H, rng_);
  auto stored = ToBf16(table);
  Dev<uint16_t> dtab(stored);
  WeightRef w;
  w.format = WeightFormat::kBF16;
  w.rows = V;
  w.cols = H;
  w.data = reinterpret_cast<const uint8_t*>(dtab.get());
  w.row_stride_bytes = H * 2;
  std::vector<int32_t> ids = {3, 49, 0, 3, 17};
  Dev<int32_t> dids(ids);
  Dev<float> out(ids.size() * H);
  STATUS_OK(gpu::Embed({w, dids.get(), static_cast<int64_t>(ids.size()), out.get()}, nullptr));
  std::vector<float> ref;
  for (int32_t id : ids) {
    for (int64_t c = 0; c < H; ++c) ref.push_back(Bf16ToF32(stored[id * H + c]));
  }
  EXPECT_EQ(out.Host(), ref);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ModelOpsTest, ::testing::Values(ActDType::kF32, ActDType::kBF16),
                         [](const auto& info) { return info.param == ActDType::kF32 ? "f32" : "bf16"; });

}  // namespace
}  // namespace moeshard
