// CPU reference kernels against direct, hand-written formulas.
#include <cmath>
#include <random>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quantize.h"

namespace moeshard {
namespace {

TEST(DTypeTest, E4M3AllCodes) {
  for (int c = 0; c < 256; ++c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    float v = E4M3ToF32(static_cast<uint8_t>(c));
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(v));
      continue;
    }
    double want = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
    if (s) want = -want;
    EXPECT_EQ(v, static_cast<float>(want)) << c;
    EXPECT_EQ(F32ToE4M3(v), c) << c;
  }
  EXPECT_EQ(E4M3ToF32(F32ToE4M3(1000.f)), 448.f);  // saturates
}

TEST(DTypeTest, HalfAndBfloatRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(F32ToF16(f), h) << h;
  }
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.00390625f)), 1.0f);  // tie rounds to even
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
}

TEST(DequantTest, Nvfp4MatchesSpecFormula) {
  std::mt19937 rng(1);
  const int rows = 3, cols = 48;
  std::vector<uint8_t> packed(rows * cols / 2), scale(rows * cols / 16);
  for (auto& b : packed) b = rng() & 0xff;
  for (auto& s : scale) s = rng() % 0x7e;
  WeightRef w{WeightFormat::kNVFP4, rows, cols, packed.data(), cols / 2, 0, scale.data(), cols / 16, 0.25f};
  const float lut[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  std::vector<float> out(cols);
  for (int r = 0; r < rows; ++r) {
    DequantRow(w, r, out.data());
    for (int c = 0; c < cols; ++c) {
      uint8_t byte = packed[r * cols / 2 + c / 2];
      uint8_t code = c % 2 ? byte >> 4 : byte & 15;
      float v = (code & 8 ? -1.f : 1.f) * lut[code & 7] * E4M3ToF32(scale[r * cols / 16 + c / 16]) * 0.25f;
      EXPECT_EQ(out[c], v) << r << "," << c;
    }
  }
  // A column window starting mid-byte.
  WeightRef win = w.ColSlice(17, 20);
  std::vector<float> full(cols), part(20);
  DequantRow(w, 1, full.data());
  DequantRow(win, 1, part.data());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(part[i], full[17 + i]);
}

TEST(DequantTest, Q8_0AndMxfp4Blocks) {
  uint8_t q8[34];
  uint16_t d = F32ToF16(0.5f);
  std::memcpy(q8, &d, 2);
  for (int i = 0; i < 32; ++i) q8[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(i - 16));
  float out[32];
  DequantQ8_0Block(q8, out);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], 0.5f * (i - 16));
  uint8_t mx[17];
  mx[0] = 128;  // 2^1
  for (int j = 0; j < 16; ++j) mx[1 + j] = static_cast<uint8_t>((j & 7) | (((j + 1) & 15) << 4));
  DequantMxfp4Block(mx, out);
  EXPECT_EQ(out[2], 2.f * 1.0f);        // code 2 -> 1.0
  EXPECT_EQ(out[16 + 8], 2.f * -0.5f);  // high nibble of byte 8 is 9 -> -0.5
}

TEST(QuantizeTest, Nvfp4RoundTripsGridValues) {
  // Values on the E2M1 grid times a power-of-two block scale come back exactly.
  const int rows = 2, cols = 32;
  std::vector<float> w(rows * cols);
  const float grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int i = 0; i < rows * cols; ++i) w[i] = (i % 3 == 0 ? -1.f : 1.f) * grid[i % 8] * 0.125f;
  w[0] = 6 * 0.125f;  // every block's max is 6 * 0.125
  w[16] = 6 * 0.125f;
  w[32] = 6 * 0.125f;
  w[48] = 6 * 0.125f;
  Nvfp4Matrix q = QuantizeNvfp4(w.data(), rows, cols);
  WeightRef ref{WeightFormat::kNVFP4, rows, cols, q.packed.data(), cols / 2, 0, q.scale.data(), cols / 16, q.scale2};
  std::vector<float> out(cols);
  for (int r = 0; r < rows; ++r) {
    DequantRow(ref, r, out.data());
    for (int c = 0; c < cols; ++c) EXPECT_NEAR(out[c], w[r * cols + c], 1e-6) << r << "," << c;
  }
}

TEST(OpsTest, MatMulMatchesNaive) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  const int N = 37, K = 64, T = 5;
  std::vector<uint16_t> wb(N * K);
  std::vector<float> x(T * K), y(T * N);
  for (auto& v : wb) v = F32ToBf16(nd(rng));
  for (auto& v : x) v = nd(rng);
  WeightRef w{WeightFormat::kBF16, N, K, reinterpret_cast<const uint8_t*>(wb.data()), K * 2};
  MatMul(x.data(), T, w, y.data());
  for (int t = 0; t < T; ++t) {
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += static_cast<double>(x[t * K + k]) * Bf16ToF32(wb[n * K + k]);
      EXPECT_NEAR(y[t * N + n], s, 1e-4) << t << "," << n;
    }
  }
  // Row and column slices select the same sub-matrix.
  WeightRef sub = w.RowSlice(3, 4).ColSlice(16, 32);
  std::vector<float> ys(T * 4), xs(T * 32);
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < 32; ++k) xs[t * 32 + k] = x[t * K + 16 + k];
  }
  MatMul(xs.data(), T, sub, ys.data(), nullptr);
  for (int t = 0; t < T; ++t) {
    for (int n = 0; n < 4; ++n) {
      double s = 0;
      for (int k = 0; k < 32; ++k) s += static_cast<double>(xs[t * 32 + k]) * Bf16ToF32(wb[(3 + n) * K + 16 + k]);
      EXPECT_NEAR(ys[t * 4 + n], s, 1e-4);
    }
  }
}

TEST(OpsTest, RoutingBothConventions) {
  std::vector<float> l = {0.f, 2.f, 1.f, 2.f};
  int32_t ids[2];
  float w[2];
  TopKRouting(l.data(), 1, 4, 2, /*softmax_topk_only=*/true, true, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);  // tie goes to the lower index first
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  TopKRouting(l.data(), 1, 4, 2, false, /*renormalize=*/false, ids, w);
  double z = 1 + 2 * std::exp(2.0) + std::exp(1.0);
  EXPECT_NEAR(w[0], std::exp(2.0) / z, 1e-6);
}

TEST(OpsTest, AttentionWindowAndCausality) {
  // One head, hd 2, 4 positions in one block; values are one-hot per position.
  const int hd = 2;
  std::vector<float> k(4 * hd, 0.f), v(4 * hd, 0.f), q(hd, 0.f), out(hd);
  for (int p = 0; p < 4; ++p) v[p * hd] = static_cast<float>(p);
  int32_t table[1] = {0};
  PagedKv kv{k.data(), v.data(), 4, table};
  Attention(q.data(), 1, 1, 1, hd, /*pos0=*/3, kv, /*window=*/0, out.data());
  EXPECT_NEAR(out[0], 1.5f, 1e-6);  // zero scores: mean of 0..3
  Attention(q.data(), 1, 1, 1, hd, 3, kv, /*window=*/2, out.data());
  EXPECT_NEAR(out[0], 2.5f, 1e-6);  // sees positions 2 and 3 only
}

}  // namespace
}  // namespace moeshard
