// Op-consistency cases for the model's per-token CUDA ops (kernels/cuda/gpu_ops.h) and the
// cuBLAS projections (kernels/cuda/gemm.h), each against its CPU reference in kernels/cpu
// (or, for the few elementwise steps the CPU runner does inline, the same loop here), in
// fp32 (tight: 2e-6 relative) and bf16 (inputs/outputs rounded to bf16: 1e-2 relative).
// Paged attention has its own file in the same binary (attention_ops_test.cc).
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
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_check.h"
#include "tests/kernels/gpu_test_util.h"
#include "tests/kernels/model_ops_test_util.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gpu_ops.h"
#include "worker/sampler.h"

namespace moeshard::ops_test {

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
  // registers, 1-2 pieces a thread), 4100 (5 pieces) and 8192 (8 pieces): plain rows in the
  // registers of 256 threads; gated, 1,024 threads of 2 pieces by default, the loop with
  // MOESHARD_RESIDUAL_WIDE=0 (ctest's model_ops_test_residual_narrow); plain rows in 1,024 threads
  // with MOESHARD_RESIDUAL_WIDE=1 (model_ops_test_residual_wide); each with the next block's fused
  // norm (fp32 copy too) and without.
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
// rows weighted in slot order, a slot at position -1 left out — rows where the direct expert
// kernels leave them (slot t·k + j at row t·k + j: the all-slots path's loads hit) and scattered
// (the grouped kernels' order: each slot read again from its position), k of 8 and 6; rows of 8,192
// (Muse Spark's width: 1,024 threads when gated, the loop kernel with MOESHARD_RESIDUAL_WIDE=0).
TEST_P(ModelOpsTest, ResidualMixesExpertRows) {
  const int64_t rows = 3, nrows = 24;
  for (auto [D, k, at_pair] :
       {std::tuple{int64_t{98}, int64_t{8}, false}, std::tuple{int64_t{2048}, int64_t{8}, false},
        std::tuple{int64_t{2048}, int64_t{8}, true}, std::tuple{int64_t{2048}, int64_t{6}, true},
        std::tuple{int64_t{1024}, int64_t{6}, false}, std::tuple{int64_t{8192}, int64_t{8}, true},
        std::tuple{int64_t{8192}, int64_t{8}, false}}) {
    for (bool gated : {false, true}) {
      SCOPED_TRACE(testing::Message() << "D " << D << " k " << k << (at_pair ? " rows at pairs" : " scattered")
                                      << " gated " << gated);
      auto s = Randn(rows * D, rng_), y = Randn(nrows * D, rng_, 2.f), wts = Randn(rows * k, rng_),
           norm = Randn(D, rng_), alpha = Randn(D, rng_), beta = Randn(D, rng_);
      std::vector<int32_t> pos(rows * k);
      for (int64_t i = 0; i < rows * k; ++i) {
        pos[i] = i % 5 == 3 ? -1 : static_cast<int32_t>(at_pair ? i : (i * 7) % nrows);
      }
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
    // Token 1's first three picks tied: experts 3 and 35 (one lane) and 40 (another), in that order.
    if (E > 40) logits[E + 3] = logits[E + 35] = logits[E + 40] = 8.f;
    // Token 2: -0 and +0 on top, tied (the lower index, -0's, first), the rest negative.
    for (int64_t e = 0; e < E; ++e) logits[2 * E + e] = -1.f - std::fabs(logits[2 * E + e]);
    logits[2 * E + 7] = -0.f;
    logits[2 * E + 3 * E / 4] = 0.f;
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

// The greedy token on the device equals the host sampler's ArgMax (the definition): rows of a
// 151,936-word vocabulary with ties (the first wins), -inf, NaNs (never win; a NaN at 0 gives 0),
// an all -inf row, and a vocabulary smaller than the slices.
TEST(ArgMaxOpTest, EqualsTheSamplersArgMax) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(7);
  for (int64_t V : {int64_t{151936}, int64_t{1000}, int64_t{7}}) {
    const int64_t rows = 9;
    std::vector<float> l = Randn(rows * V, rng, 3.f);
    auto row = [&](int64_t r) { return l.data() + r * V; };
    row(1)[V / 3] = 50.f;  // a tie: the first of the two wins
    row(1)[V - 1] = 50.f;
    row(2)[V - 1] = 60.f;  // the last id
    row(3)[0] = NAN;       // a NaN at 0 gives 0
    row(3)[V / 2] = 99.f;
    row(4)[V / 2] = NAN;   // NaNs elsewhere never win
    row(4)[V / 4] = 80.f;
    row(4)[V - 2] = NAN;
    for (int64_t i = 0; i < V; ++i) row(5)[i] = -INFINITY;  // all -inf: 0
    row(6)[0] = 70.f;                                        // the first id
    for (int64_t i = 0; i < V; ++i) row(7)[i] = i % 3 == 0 ? NAN : -INFINITY;  // NaN at 0 again
    for (int64_t i = 0; i < V; ++i) row(8)[i] = i == 0 ? -INFINITY : NAN;      // only id 0 is a number
    Dev<float> dl(l);
    Dev<uint8_t> scratch(static_cast<size_t>(gpu::ArgMaxBytes(rows)));
    Dev<int32_t> out(static_cast<size_t>(rows));
    gpu::ArgMaxParams a;
    a.logits = dl.get();
    a.rows = rows;
    a.vocab = V;
    a.partial_value = reinterpret_cast<float*>(scratch.get());
    a.partial_index = reinterpret_cast<int64_t*>(scratch.get() + rows * gpu::kArgMaxSplits * sizeof(float));
    a.out = out.get();
    STATUS_OK(gpu::ArgMax(a, nullptr));
    const std::vector<int32_t> got = out.Host();
    for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(got[r], ArgMax(row(r), V)) << "V " << V << " row " << r;
    EXPECT_EQ(got[1], V / 3);
    EXPECT_EQ(got[2], V - 1);
    EXPECT_EQ(got[3], 0);
    EXPECT_EQ(got[5], 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ModelOpsTest, ::testing::Values(ActDType::kF32, ActDType::kBF16),
                         [](const auto& info) { return info.param == ActDType::kF32 ? "f32" : "bf16"; });

}  // namespace moeshard::ops_test
