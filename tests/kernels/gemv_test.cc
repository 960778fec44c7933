// The decode GEMV (kernels/cuda/gemv.h) against the CPU reference MatMul over the same weights:
// bf16 rows with bf16 x, fp32 rows with fp32 x, and Q8_0 rows (quantized by the GGUF writer's
// quantizer, converted to split Q8 on the device) with bf16 x; 1 to 8 tokens, odd row counts,
// three matrices in one launch with biases, fp32 and bf16 outputs, and K of 768, 2048 and 4096
// (two token groups), 9-64 tokens of split Q8 in one launch (gemv_wide.cu), and split Q8 on x of
// a wide range, inf and NaN. Also the
// split-Q8 expansion, bit for bit against ExpandWeights of the
// Q8_0 bytes, and Gemm's chunked expansion of split-Q8 weights (prefill-sized batches).
// Labelled `gpu`; exits 77 (SKIPPED) where no CUDA device is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "common/formats/gguf_quant.h"
#include "gtest/gtest.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gpu_ops.h"
#include "tests/kernels/gpu_test_util.h"

namespace moeshard {
namespace {

using gpu::ActDType;
using gpu::GemvWeight;

struct DevBuf {
  explicit DevBuf(size_t bytes) { cudaMalloc(&p, std::max<size_t>(bytes, 16)); }
  DevBuf(const void* h, size_t bytes) : DevBuf(bytes) { cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice); }
  ~DevBuf() { cudaFree(p); }
  template <typename T>
  std::vector<T> Host(size_t n) const {
    std::vector<T> h(n);
    cudaDeviceSynchronize();
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  void* p = nullptr;
};

// One matrix in every form the test needs: host fp32 values the reference multiplies (exactly
// the stored weights' values), and the device weights.
struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> ref;        // [rows, cols] fp32 values of the stored weights
  std::string q8;                // Q8_0 bytes (kQ8)
  std::unique_ptr<DevBuf> w, scales, q8_dev;
  std::vector<float> bias;
  std::unique_ptr<DevBuf> bias_dev;
};

Matrix MakeMatrix(GemvWeight t, int64_t rows, int64_t cols, std::mt19937& rng) {
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  std::normal_distribution<float> d(0.f, 1.f / std::sqrt(static_cast<float>(cols)));
  std::vector<float> v(rows * cols);
  for (auto& x : v) x = d(rng);
  if (t == GemvWeight::kQ8) {
    for (int64_t r = 0; r < rows; ++r) QuantizeRowQ8_0(v.data() + r * cols, cols, &m.q8);
    WeightRef ref;
    ref.format = WeightFormat::kQ8_0;
    ref.rows = rows;
    ref.cols = cols;
    ref.data = reinterpret_cast<const uint8_t*>(m.q8.data());
    ref.row_stride_bytes = WeightRowBytes(WeightFormat::kQ8_0, cols);
    m.ref.resize(rows * cols);
    for (int64_t r = 0; r < rows; ++r) DequantRow(ref, r, m.ref.data() + r * cols);
    m.q8_dev = std::make_unique<DevBuf>(m.q8.data(), m.q8.size());
    m.w = std::make_unique<DevBuf>(rows * cols);
    m.scales = std::make_unique<DevBuf>(rows * cols / 32 * 2);
    ref.data = static_cast<const uint8_t*>(m.q8_dev->p);
    EXPECT_TRUE(gpu::GemvSplitQ8(ref, static_cast<int8_t*>(m.w->p), static_cast<uint16_t*>(m.scales->p), nullptr).ok());
  } else if (t == GemvWeight::kBF16) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = F32ToBf16(v[i]);
    for (size_t i = 0; i < v.size(); ++i) v[i] = Bf16ToF32(b[i]);
    m.ref = v;
    m.w = std::make_unique<DevBuf>(b.data(), b.size() * 2);
  } else {
    m.ref = v;
    m.w = std::make_unique<DevBuf>(v.data(), v.size() * 4);
  }
  m.bias.resize(rows);
  for (auto& b : m.bias) b = d(rng);
  m.bias_dev = std::make_unique<DevBuf>(m.bias.data(), rows * 4);
  return m;
}

std::vector<float> RefMatMul(const std::vector<float>& x, int64_t T, const std::vector<float>& wref, int64_t rows,
                             int64_t cols, const float* bias) {
  WeightRef w;
  w.format = WeightFormat::kF32;
  w.rows = rows;
  w.cols = cols;
  w.data = reinterpret_cast<const uint8_t*>(wref.data());
  w.row_stride_bytes = cols * 4;
  std::vector<float> y(T * rows);
  MatMul(x.data(), T, w, y.data(), bias);
  return y;
}

double MaxRelErr(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num = std::max(num, std::fabs(static_cast<double>(got[i]) - ref[i]));
    den = std::max(den, std::fabs(static_cast<double>(ref[i])));
  }
  return num / std::max(den, 1e-30);
}

struct Shape {
  GemvWeight wtype;
  int64_t K;
  bool wide = false;  // 9-64 tokens in one launch (gemv_wide.cu) instead of 1-8
};

// Cases skip where no CUDA device is present (gpu_test_main then exits 77: SKIPPED).
void SkipWithoutDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
}

class GemvTest : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override { SkipWithoutDevice(); }
};

class GemvQ8 : public ::testing::Test {
 protected:
  void SetUp() override { SkipWithoutDevice(); }
};

TEST_P(GemvTest, ThreeMatricesEveryTokenCountBothOutputs) {
  const Shape sh = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(sh.K) * 7 + static_cast<uint32_t>(sh.wtype));
  const int64_t rows[3] = {sh.wide ? 300 : 130, 7, sh.wide ? 129 : 1};
  Matrix ms[3] = {MakeMatrix(sh.wtype, rows[0], sh.K, rng), MakeMatrix(sh.wtype, rows[1], sh.K, rng),
                  MakeMatrix(sh.wtype, rows[2], sh.K, rng)};
  const bool x_f32 = sh.wtype == GemvWeight::kF32;
  const std::vector<int64_t> counts =
      sh.wide ? std::vector<int64_t>{9, 16, 17, 33, 64} : std::vector<int64_t>{1, 2, 3, 4, 5, 8};
  for (int64_t T : counts) {
    if (sh.wide) {
      ASSERT_TRUE(gpu::GemvWideTakes(sh.wtype, false, sh.K, T)) << T;
    }
    for (ActDType y_dtype : {ActDType::kF32, ActDType::kBF16}) {
      SCOPED_TRACE(testing::Message() << "K " << sh.K << " T " << T << " y " << (y_dtype == ActDType::kF32 ? "f32" : "bf16"));
      std::normal_distribution<float> d(0.f, 1.f);
      std::vector<float> x(T * sh.K);
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        x[i] = d(rng);
        xb[i] = F32ToBf16(x[i]);
        if (!x_f32) x[i] = Bf16ToF32(xb[i]);
      }
      DevBuf xd(x_f32 ? static_cast<const void*>(x.data()) : xb.data(), x.size() * (x_f32 ? 4 : 2));
      gpu::GemvParams p;
      p.wtype = sh.wtype;
      p.x = xd.p;
      p.x_dtype = x_f32 ? ActDType::kF32 : ActDType::kBF16;
      p.y_dtype = y_dtype;
      p.cols = sh.K;
      p.num_tokens = T;
      p.num_matrices = 3;
      std::vector<std::unique_ptr<DevBuf>> ys;
      const size_t ye = y_dtype == ActDType::kF32 ? 4 : 2;
      for (int i = 0; i < 3; ++i) {
        // Poisoned outputs with a row stride wider than the matrix: every written element is checked,
        // and the padding must stay poisoned.
        const int64_t stride = rows[i] + 3;
        std::vector<uint8_t> poison(T * stride * ye, 0xff);
        ys.push_back(std::make_unique<DevBuf>(poison.data(), poison.size()));
        p.m[i] = {ms[i].w->p, ms[i].scales ? static_cast<const uint16_t*>(ms[i].scales->p) : nullptr, rows[i],
                  i == 1 ? nullptr : static_cast<const float*>(ms[i].bias_dev->p), ys[i]->p, stride};
      }
      ASSERT_TRUE(gpu::Gemv(p, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (int i = 0; i < 3; ++i) {
        const int64_t stride = rows[i] + 3;
        auto ref = RefMatMul(x, T, ms[i].ref, rows[i], sh.K, i != 1 ? ms[i].bias.data() : nullptr);
        std::vector<float> got(T * rows[i]);
        if (y_dtype == ActDType::kF32) {
          auto h = ys[i]->Host<float>(T * stride);
          for (int64_t t = 0; t < T; ++t) {
            for (int64_t r = 0; r < rows[i]; ++r) got[t * rows[i] + r] = h[t * stride + r];
            for (int64_t r = rows[i]; r < stride; ++r) EXPECT_TRUE(std::isnan(h[t * stride + r])) << "padding written";
          }
        } else {
          auto h = ys[i]->Host<uint16_t>(T * stride);
          for (int64_t t = 0; t < T; ++t) {
            for (int64_t r = 0; r < rows[i]; ++r) got[t * rows[i] + r] = Bf16ToF32(h[t * stride + r]);
            for (int64_t r = rows[i]; r < stride; ++r) EXPECT_EQ(h[t * stride + r], 0xffff) << "padding written";
          }
        }
        // fp32 accumulation of exactly represented products: far under 1e-5; bf16 outputs round once.
        EXPECT_LE(MaxRelErr(got, ref), y_dtype == ActDType::kF32 ? 1e-5 : 8e-3) << "matrix " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvTest,
                         ::testing::Values(Shape{GemvWeight::kQ8, 2048}, Shape{GemvWeight::kQ8, 768},
                                           Shape{GemvWeight::kQ8, 4096}, Shape{GemvWeight::kBF16, 2048},
                                           Shape{GemvWeight::kBF16, 784}, Shape{GemvWeight::kF32, 2048},
                                           Shape{GemvWeight::kF32, 4096}, Shape{GemvWeight::kQ8, 2048, true},
                                           Shape{GemvWeight::kQ8, 4096, true}, Shape{GemvWeight::kQ8, 576, true}));

// Token counts and weights the wide kernel does not take are an error, not a wrong answer.
TEST_F(GemvQ8, MoreTokensThanALaunchTakesIsAnError) {
  EXPECT_FALSE(gpu::GemvWideTakes(GemvWeight::kQ8, false, 2048, 65));
  EXPECT_FALSE(gpu::GemvWideTakes(GemvWeight::kBF16, false, 2048, 16));
  EXPECT_FALSE(gpu::GemvWideTakes(GemvWeight::kQ8, true, 2048, 16));
  EXPECT_FALSE(gpu::GemvWideTakes(GemvWeight::kQ8, false, 2080, 16));  // K % 64 != 0
  std::mt19937 rng(23);
  Matrix m = MakeMatrix(GemvWeight::kQ8, 16, 256, rng);
  DevBuf xd(65 * 256 * 2), y(65 * 16 * 4);
  gpu::GemvParams p;
  p.wtype = GemvWeight::kQ8;
  p.x = xd.p;
  p.x_dtype = ActDType::kBF16;
  p.cols = 256;
  p.num_tokens = 65;
  p.m[0] = {m.w->p, static_cast<const uint16_t*>(m.scales->p), 16, nullptr, y.p, 0};
  const absl::Status st = gpu::Gemv(p, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("at most 8"), std::string::npos) << st;
}

// Split Q8 with bf16 x for two tokens (gemv_mma.cu) and twelve (gemv_wide.cu): x spanning
// 2^-30..2^12 inside each block, zeros, the
// block's largest negative, and whole blocks of tiny values must all give the fp64 dot to
// fp32 accuracy, each row's error against the sum of |products| (not the row's result, so an
// element rounded away in a block of large ones would show). An inf or NaN anywhere in x makes
// every output of that token non-finite (never a finite wrong value); the other token's stay exact.
TEST_F(GemvQ8, WideRangeActivationsAndNonFinite) {
  std::mt19937 rng(11);
  const int64_t N = 67, K = 1024;
  Matrix m = MakeMatrix(GemvWeight::kQ8, N, K, rng);
  std::uniform_int_distribution<int> ex(-30, 12), kind(0, 9);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  for (const auto& [bad, T] : {std::pair{0, int64_t{2}}, std::pair{1, int64_t{2}}, std::pair{2, int64_t{2}},
                               std::pair{0, int64_t{12}}, std::pair{2, int64_t{12}}}) {
    // bad 0: finite x; 1: an inf in token 1; 2: a NaN in token 1. Two tokens: gemv_mma.cu; 12: gemv_wide.cu.
    SCOPED_TRACE(testing::Message() << "case " << bad << " T " << T);
    std::vector<uint16_t> xb(T * K);
    for (int64_t i = 0; i < T * K; ++i) {
      const int k = kind(rng);
      const float v = k == 0 ? 0.f : std::ldexp(mant(rng), ex(rng)) * (k % 2 ? -1.f : 1.f);
      xb[i] = F32ToBf16(v);
    }
    for (int64_t i = 64; i < 96; ++i) xb[i] = F32ToBf16(std::ldexp(mant(rng), -100));  // a block of tiny values
    xb[130] = F32ToBf16(-std::ldexp(1.99f, 12));                                       // a block's largest, negative
    if (bad == 1) xb[K + 517] = 0x7f80;
    if (bad == 2) xb[K + 3] = 0x7fc1;
    DevBuf xd(xb.data(), xb.size() * 2), y(T * N * 4);
    gpu::GemvParams p;
    p.wtype = GemvWeight::kQ8;
    p.x = xd.p;
    p.x_dtype = ActDType::kBF16;
    p.y_dtype = ActDType::kF32;
    p.cols = K;
    p.num_tokens = T;
    p.m[0] = {m.w->p, static_cast<const uint16_t*>(m.scales->p), N, nullptr, y.p, 0};
    ASSERT_TRUE(gpu::Gemv(p, nullptr).ok());
    const auto got = y.Host<float>(T * N);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t r = 0; r < N; ++r) {
        double dot = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double prod = static_cast<double>(m.ref[r * K + k]) * Bf16ToF32(xb[t * K + k]);
          dot += prod;
          mag += std::fabs(prod);
        }
        const float g = got[t * N + r];
        if (t == 1 && bad != 0) {
          EXPECT_FALSE(std::isfinite(g)) << "row " << r << ": " << g;
        } else {
          ASSERT_TRUE(std::isfinite(g)) << "token " << t << " row " << r;
          EXPECT_LE(std::fabs(g - dot), 2e-6 * mag) << "token " << t << " row " << r << ": " << g << " vs " << dot;
        }
      }
    }
  }
}

TEST_F(GemvQ8, ExpansionIsExpandWeightsBitForBit) {
  std::mt19937 rng(3);
  Matrix m = MakeMatrix(GemvWeight::kQ8, 37, 256, rng);
  for (ActDType dt : {ActDType::kF32, ActDType::kBF16}) {
    const size_t elem = dt == ActDType::kF32 ? 4 : 2;
    DevBuf a(37 * 256 * elem), b(37 * 256 * elem);
    ASSERT_TRUE(gpu::GemvExpandQ8(static_cast<int8_t*>(m.w->p), static_cast<uint16_t*>(m.scales->p), 37, 256, a.p, dt,
                                  nullptr).ok());
    gpu::ExpandParams e;
    e.w.format = WeightFormat::kQ8_0;
    e.w.rows = 37;
    e.w.cols = 256;
    e.w.data = static_cast<const uint8_t*>(m.q8_dev->p);
    e.w.row_stride_bytes = WeightRowBytes(WeightFormat::kQ8_0, 256);
    e.out = b.p;
    e.out_dtype = dt;
    ASSERT_TRUE(gpu::ExpandWeights(e, nullptr).ok());
    EXPECT_EQ(a.Host<uint16_t>(37 * 256 * elem / 2), b.Host<uint16_t>(37 * 256 * elem / 2));
  }
}

TEST_F(GemvQ8, GemmExpandsSplitQ8InChunks) {
  std::mt19937 rng(5);
  const int64_t T = 40, N = 300, K = 512;
  Matrix m = MakeMatrix(GemvWeight::kQ8, N, K, rng);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(T * K);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = F32ToBf16(d(rng));
    x[i] = Bf16ToF32(xb[i]);
  }
  DevBuf xd(xb.data(), xb.size() * 2), y(T * N * 4), scratch(64 * K * 2);  // 64 rows a chunk: 5 chunks
  auto g = gpu::Gemm::Create(nullptr);
  ASSERT_TRUE(g.ok()) << g.status();
  gpu::GemmArgs a;
  a.w = {m.w->p, ActDType::kBF16, N, K};
  a.w.q8_scales = static_cast<const uint16_t*>(m.scales->p);
  a.x = xd.p;
  a.x_dtype = ActDType::kBF16;
  a.y = y.p;
  a.y_dtype = ActDType::kF32;
  a.num_tokens = T;
  EXPECT_FALSE((*g)->Run(a).ok()) << "no scratch must be an error";
  a.scratch = scratch.p;
  a.scratch_bytes = 64 * K * 2;
  ASSERT_TRUE((*g)->Run(a).ok());
  // The reference multiplies the bf16-rounded weights, as the expansion feeds cuBLAS.
  std::vector<float> wb = m.ref;
  for (auto& v : wb) v = Bf16ToF32(F32ToBf16(v));
  EXPECT_LE(MaxRelErr(y.Host<float>(T * N), RefMatMul(x, T, wb, N, K, nullptr)), 1e-5);
}

// The plain residual update s += out of T rows of K, with the next block's norm (eps 1e-6) into xn.
gpu::ResidualParams UpdateWithNorm(void* s, const void* out, int64_t T, int64_t K, const void* norm, void* xn,
                                   ActDType xn_dtype) {
  gpu::ResidualParams r;
  r.s = static_cast<float*>(s);
  r.out = static_cast<const float*>(out);
  r.rows = T;
  r.dim = K;
  r.eps = 1e-6f;
  r.next_norm = static_cast<const float*>(norm);
  r.next_out = xn;
  r.next_dtype = xn_dtype;
  return r;
}

// One matrix's GEMV of T tokens of x into fp32 y.
gpu::GemvParams OneMatrix(GemvWeight wt, const Matrix& m, int64_t N, int64_t K, int64_t T, const void* x,
                          ActDType x_dtype, void* y) {
  gpu::GemvParams p;
  p.wtype = wt;
  p.x = x;
  p.x_dtype = x_dtype;
  p.y_dtype = ActDType::kF32;
  p.cols = K;
  p.num_tokens = T;
  p.m[0] = {m.w->p, m.scales ? static_cast<const uint16_t*>(m.scales->p) : nullptr, N, nullptr, y, 0};
  return p;
}

// The residual update folded into a GEMV (GemvResidualIn, the router of an MoE block after its
// attention block): the GEMV's outputs and its xn must be, bit for bit, those of the residual
// kernel (s += add, the next block's norm into xn and an fp32 copy) followed by the GEMV on that
// fp32 copy; s itself stays as it was. Then the MLP block's update with pre_add must leave s as
// the two updates one after the other, with the same next-block norm. fp32 router rows and a
// split-Q8 matrix (one row a warp at K = 4096), 1, 3 and 8 tokens, bf16 and fp32 xn.
TEST_F(GemvQ8, ResidualFoldedInEqualsResidualThenGemv) {
  std::mt19937 rng(17);
  std::normal_distribution<float> d(0.f, 1.f);
  for (const auto& [wt, K, N] : {std::tuple{GemvWeight::kF32, int64_t{2048}, int64_t{128}},
                                 std::tuple{GemvWeight::kF32, int64_t{768}, int64_t{40}},
                                 std::tuple{GemvWeight::kQ8, int64_t{4096}, int64_t{64}}}) {
    Matrix m = MakeMatrix(wt, N, K, rng);
    for (int64_t T : {1, 3, 8}) {
      for (ActDType xn_dtype : {ActDType::kBF16, ActDType::kF32}) {
        SCOPED_TRACE(testing::Message() << "K " << K << " T " << T << (xn_dtype == ActDType::kF32 ? " f32" : " bf16"));
        std::vector<float> s(T * K), add(T * K), out2(T * K), norm(K), norm2(K);
        for (auto& v : s) v = 3.f * d(rng);
        for (auto& v : add) v = d(rng);
        for (auto& v : out2) v = d(rng);
        for (auto& v : norm) v = 1.f + 0.2f * d(rng);
        for (auto& v : norm2) v = 1.f + 0.2f * d(rng);
        const size_t xe = xn_dtype == ActDType::kF32 ? 4 : 2;
        DevBuf sa(s.data(), s.size() * 4), sb(s.data(), s.size() * 4), da(add.data(), add.size() * 4),
            dn(norm.data(), K * 4), dn2(norm2.data(), K * 4), o2(out2.data(), out2.size() * 4), xna(T * K * xe),
            xnb(T * K * xe), x32(T * K * 4), ya(T * N * 4), yb(T * N * 4), nxa(T * K * 2), nxb(T * K * 2);
        // A: the residual kernel, then the GEMV on its fp32 copy.
        gpu::ResidualParams r = UpdateWithNorm(sa.p, da.p, T, K, dn.p, xna.p, xn_dtype);
        r.next_out_f32 = static_cast<float*>(x32.p);
        ASSERT_TRUE(gpu::Residual(r, nullptr).ok());
        const gpu::GemvParams p = OneMatrix(wt, m, N, K, T, x32.p, ActDType::kF32, ya.p);
        ASSERT_TRUE(gpu::Gemv(p, nullptr).ok());
        // B: the GEMV with the update folded in.
        gpu::GemvParams q = p;
        q.x = nullptr;
        q.res = {static_cast<const float*>(sb.p), static_cast<const float*>(da.p), static_cast<const float*>(dn.p),
                 1e-6f, xnb.p, xn_dtype};
        q.m[0].y = yb.p;
        ASSERT_TRUE(gpu::Gemv(q, nullptr).ok());
        EXPECT_EQ(ya.Host<uint32_t>(T * N), yb.Host<uint32_t>(T * N)) << "GEMV outputs";
        EXPECT_EQ(xna.Host<uint16_t>(T * K * xe / 2), xnb.Host<uint16_t>(T * K * xe / 2)) << "xn";
        EXPECT_EQ(sb.Host<float>(T * K), s) << "s must stay as it was";
        // The MLP block's update: A adds out2 to its updated s; B adds add, then out2 (pre_add).
        for (auto [buf, pre, nx] : {std::tuple{&sa, static_cast<const float*>(nullptr), &nxa},
                                    std::tuple{&sb, static_cast<const float*>(da.p), &nxb}}) {
          gpu::ResidualParams u;
          u.s = static_cast<float*>(buf->p);
          u.out = static_cast<const float*>(o2.p);
          u.pre_add = pre;
          u.rows = T;
          u.dim = K;
          u.eps = 1e-6f;
          u.next_norm = static_cast<const float*>(dn2.p);
          u.next_out = nx->p;
          u.next_dtype = ActDType::kBF16;
          ASSERT_TRUE(gpu::Residual(u, nullptr).ok());
        }
        EXPECT_EQ(sa.Host<uint32_t>(T * K), sb.Host<uint32_t>(T * K)) << "s after the MLP block's update";
        EXPECT_EQ(nxa.Host<uint16_t>(T * K), nxb.Host<uint16_t>(T * K)) << "the next block's input";
      }
    }
  }
  gpu::GemvParams bad;
  bad.wtype = GemvWeight::kF32;
  bad.cols = 256;
  bad.num_tokens = 1;
  float dummy[4];
  bad.res.s = dummy;  // no norm
  EXPECT_EQ(gpu::Gemv(bad, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// The next block's norm of an update a kernel before stored in s (GemvResidualIn without add: the
// Q/K/V GEMV after the experts' down kernel updated s, moe_expert.h MoeExpertStepResidual): the
// GEMV's outputs and its xn must be, bit for bit, those of the residual kernel's fused norm (xn in
// the activation dtype) followed by the GEMV on that xn — bf16 xn with x rounded to bf16
// (round_x), fp32 xn without. Split-Q8 rows at one token (from two, bf16 x takes the tensor-core
// kernel, which the folded form does not), fp32 rows at 1 and 3.
TEST_F(GemvQ8, ResidualNormOfStoredUpdateEqualsResidualThenGemv) {
  std::mt19937 rng(23);
  std::normal_distribution<float> d(0.f, 1.f);
  for (const auto& [wt, K, N] : {std::tuple{GemvWeight::kQ8, int64_t{2048}, int64_t{96}},
                                 std::tuple{GemvWeight::kF32, int64_t{768}, int64_t{40}}}) {
    Matrix m = MakeMatrix(wt, N, K, rng);
    for (int64_t T : {1, 3}) {
      if (wt == GemvWeight::kQ8 && T > 1) continue;
      for (ActDType xn_dtype : {ActDType::kBF16, ActDType::kF32}) {
        SCOPED_TRACE(testing::Message() << "K " << K << " T " << T << (xn_dtype == ActDType::kF32 ? " f32" : " bf16"));
        std::vector<float> s(T * K), out(T * K), norm(K);
        for (auto& v : s) v = 3.f * d(rng);
        for (auto& v : out) v = d(rng);
        for (auto& v : norm) v = 1.f + 0.2f * d(rng);
        const size_t xe = xn_dtype == ActDType::kF32 ? 4 : 2;
        DevBuf ds(s.data(), s.size() * 4), dout(out.data(), out.size() * 4), dn(norm.data(), K * 4), xna(T * K * xe),
            xnb(T * K * xe), ya(T * N * 4), yb(T * N * 4);
        // A: the residual kernel (s += out, the next norm into xn), then the GEMV on xn.
        const gpu::ResidualParams r = UpdateWithNorm(ds.p, dout.p, T, K, dn.p, xna.p, xn_dtype);
        ASSERT_TRUE(gpu::Residual(r, nullptr).ok());
        const std::vector<uint32_t> s_after = ds.Host<uint32_t>(T * K);
        const gpu::GemvParams p = OneMatrix(wt, m, N, K, T, xna.p, xn_dtype, ya.p);
        ASSERT_TRUE(gpu::Gemv(p, nullptr).ok());
        // B: the GEMV computing the norm from the updated s.
        for (bool early : {false, true}) {  // the norm's weights loaded after the block sum, or staged first
          SCOPED_TRACE(early ? "norm weights staged early" : "norm weights loaded late");
          ASSERT_EQ(cudaMemset(xnb.p, 0xff, T * K * xe), cudaSuccess);
          ASSERT_EQ(cudaMemset(yb.p, 0xff, T * N * 4), cudaSuccess);
          gpu::GemvParams q = p;
          q.x = nullptr;
          q.res = {static_cast<const float*>(ds.p), nullptr, static_cast<const float*>(dn.p), 1e-6f, xnb.p, xn_dtype,
                   xn_dtype == ActDType::kBF16, early};
          q.m[0].y = yb.p;
          ASSERT_TRUE(gpu::Gemv(q, nullptr).ok());
          EXPECT_EQ(ya.Host<uint32_t>(T * N), yb.Host<uint32_t>(T * N)) << "GEMV outputs";
          EXPECT_EQ(xna.Host<uint16_t>(T * K * xe / 2), xnb.Host<uint16_t>(T * K * xe / 2)) << "xn";
          EXPECT_EQ(ds.Host<uint32_t>(T * K), s_after) << "s must stay as it was";
        }
      }
    }
  }
}

}  // namespace
}  // namespace moeshard
