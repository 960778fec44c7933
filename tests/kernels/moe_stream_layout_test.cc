// The streaming kernels' layouts on the CPU, without a GPU: matrices repacked by the repack
// kernels' own per-thread functions (kernels/moe/moe_stream_decode.h E2m1RepackWord for NVFP4 and
// MXFP4, moe_q8_stream_layout.h Q8StreamRepackGroup for Q8_0), then read the way a consumer warp
// of moe_stream.cuh reads one 16-row slice — each lane's words at the layouts' offsets, decoded by
// the kernels' own lane functions (DecodeRepacked, E2m1ScalePair, Q8LaneFragments, F16x2ToF32;
// their instructions emulated exactly on the host, kernels/cuda/lane_ops.h) into A registers —
// and multiplied by the m16n8k16 fragment rules of the PTX ISA (lane (g, c): a0 = A[g][2c, 2c+1],
// a1 = A[g+8][2c, 2c+1], a2 = A[g][2c+8, 2c+9], a3 = A[g+8][2c+8, 2c+9]; b0 = B[2c, 2c+1][g],
// b1 = B[2c+8, 2c+9][g]; results D[g][2c, 2c+1] and D[g+8][2c, 2c+1]). The products must be the
// CPU dequant's W · x for 8 tokens within fp32 rounding: any disagreement between what a repack
// writes and what a lane reads, between A's and B's k, or in the bit work of a decode moves them
// by far more.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/dequant.h"
#include "kernels/moe/moe_q8_stream_layout.h"
#include "kernels/moe/moe_stream_decode.h"

namespace moeshard::gpu {  // the layouts' functions, unqualified
namespace {

struct Words4 {
  uint32_t x, y, z, w;  // as the kernels' uint4
};

Words4 Load16(const uint8_t* p) {
  Words4 v;
  std::memcpy(&v, p, 16);
  return v;
}

float Lo(uint32_t r) { return Bf16ToF32(static_cast<uint16_t>(r)); }
float Hi(uint32_t r) { return Bf16ToF32(static_cast<uint16_t>(r >> 16)); }

// One m16n8k16 product from 32 lanes' registers a[lane][0..3], b[lane][0..1] (bf16 pairs), added to
// D by the fragment rules.
void Mma(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], double (&D)[16][8]) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, c = lane % 4;
    const int ar[4] = {g, g + 8, g, g + 8}, ak[4] = {2 * c, 2 * c, 2 * c + 8, 2 * c + 8};
    for (int i = 0; i < 4; ++i) A[ar[i]][ak[i]] = Lo(a[lane][i]), A[ar[i]][ak[i] + 1] = Hi(a[lane][i]);
    B[2 * c][g] = Lo(b[lane][0]), B[2 * c + 1][g] = Hi(b[lane][0]);
    B[2 * c + 8][g] = Lo(b[lane][1]), B[2 * c + 9][g] = Hi(b[lane][1]);
  }
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n)
      for (int k = 0; k < 16; ++k) D[r][n] += double(A[r][k]) * B[k][n];
}

// A repacked matrix: the codes and scales of every chunk.
struct Repacked {
  std::vector<uint8_t> codes, scales;
  int64_t chunks;  // a slice's
};

// 8 tokens of bf16 activations, `cols` each.
std::vector<std::vector<uint16_t>> Tokens(int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<std::vector<uint16_t>> x(8, std::vector<uint16_t>(cols));
  for (auto& row : x)
    for (auto& v : row) v = F32ToBf16(normal(rng));
  return x;
}

// Token n's 16-byte load of its activations at byte `off` of chunk kc's row.
uint32_t XWord(const std::vector<uint16_t>& x, int64_t kc, int off, int word) {
  uint32_t v;
  std::memcpy(&v, reinterpret_cast<const uint8_t*>(x.data() + kc * 256) + off + 4 * word, 4);
  return v;
}

// e2m1: slice s of the product, as moe_stream.cuh's ComputeStageE2m1 computes it (one slice, one
// n8 tile) and its epilogue scales it (scale2 · 2^8).
void EmulateE2m1(const Repacked& rp, int64_t s, bool mx, float scale2, const std::vector<std::vector<uint16_t>>& x,
                 float out[16][8]) {
  double D[16][8] = {};
  for (int64_t kc = 0; kc < rp.chunks; ++kc) {
    const uint8_t* sb = rp.codes.data() + (s * rp.chunks + kc) * 2048;
    const uint8_t* ss = rp.scales.data() + (s * rp.chunks + kc) * E2m1ScaleBytes(mx);
    for (int q = 0; q < 4; ++q) {
      uint32_t ag[32][2][4], ag8[32][2][4], bq[32][2][4];  // [lane][jw][...]
      for (int lane = 0; lane < 32; ++lane) {
        const Words4 wd = Load16(sb + (q * 32 + lane) * 16);
        uint32_t sc, s2[2];
        std::memcpy(&sc, ss + E2m1ScaleWord(lane, q, mx), 4);
        E2m1ScalePair(sc, q, mx, s2);
        DecodeRepacked(wd.x, s2[0], ag[lane][0]);
        DecodeRepacked(wd.y, s2[1], ag8[lane][0]);
        DecodeRepacked(wd.z, s2[0], ag[lane][1]);
        DecodeRepacked(wd.w, s2[1], ag8[lane][1]);
        const int g = lane / 4, c = lane % 4;
        for (int i = 0; i < 8; ++i) bq[lane][i / 4][i % 4] = XWord(x[g], kc, q * 128 + c * 32, i);
      }
      for (int jw = 0; jw < 2; ++jw) {
        for (int uu = 0; uu < 2; ++uu) {
          uint32_t a[32][4], b[32][2];
          for (int lane = 0; lane < 32; ++lane) {
            a[lane][0] = ag[lane][jw][2 * uu], a[lane][1] = ag8[lane][jw][2 * uu];
            a[lane][2] = ag[lane][jw][2 * uu + 1], a[lane][3] = ag8[lane][jw][2 * uu + 1];
            b[lane][0] = bq[lane][jw][2 * uu], b[lane][1] = bq[lane][jw][2 * uu + 1];
          }
          Mma(a, b, D);
        }
      }
    }
  }
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) out[r][n] = static_cast<float>(D[r][n]) * (scale2 * 256.f);
}

// int8: slice s of the product as ComputeStageQ8 computes it: per 32-column block two k16 steps
// into a fresh accumulator, added times the block's scales of rows g and g + 8.
void EmulateQ8(const Repacked& rp, int64_t s, const std::vector<std::vector<uint16_t>>& x, float out[16][8]) {
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 8; ++n) out[r][n] = 0.f;
  for (int64_t kc = 0; kc < rp.chunks; ++kc) {
    const uint8_t* sb = rp.codes.data() + (s * rp.chunks + kc) * kQ8StreamSliceBytes;
    const uint8_t* ss = rp.scales.data() + (s * rp.chunks + kc) * kQ8StreamSliceScaleBytes;
    for (int b = 0; b < 8; ++b) {
      uint32_t a[32][2][4], xb[32][4];
      float d[32][2];
      for (int lane = 0; lane < 32; ++lane) {
        const Words4 v = Load16(sb + Q8StreamLaneCodes(b, lane));
        Q8LaneFragments(v.x, v.y, v.z, v.w, a[lane]);
        uint32_t sc;
        std::memcpy(&sc, ss + Q8StreamLaneScales(b / 2, lane) + 4 * (b % 2), 4);
        F16x2ToF32(sc, d[lane][0], d[lane][1]);
        for (int i = 0; i < 4; ++i) xb[lane][i] = XWord(x[lane / 4], kc, Q8StreamLaneB(b, lane), i);
      }
      double D[16][8] = {};
      for (int t = 0; t < 2; ++t) {
        uint32_t at[32][4], bt[32][2];
        for (int lane = 0; lane < 32; ++lane) {
          for (int i = 0; i < 4; ++i) at[lane][i] = a[lane][t][i];
          bt[lane][0] = xb[lane][2 * t], bt[lane][1] = xb[lane][2 * t + 1];
        }
        Mma(at, bt, D);
      }
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, c = lane % 4;
        for (int j = 0; j < 2; ++j) {
          out[g][2 * c + j] += static_cast<float>(D[g][2 * c + j]) * d[lane][0];
          out[g + 8][2 * c + j] += static_cast<float>(D[g + 8][2 * c + j]) * d[lane][1];
        }
      }
    }
  }
}

// Every row of every slice against the CPU dequant's dot products.
template <typename Emulate>
void ExpectProduct(const WeightRef& view, const std::vector<std::vector<uint16_t>>& x, Emulate emulate) {
  std::vector<float> w(view.cols);
  int checked = 0;
  for (int64_t s = 0; s < view.rows / 16; ++s) {
    float got[16][8];
    emulate(s, got);
    for (int r = 0; r < 16; ++r) {
      DequantRow(view, 16 * s + r, w.data());
      for (int n = 0; n < 8; ++n) {
        double want = 0, mag = 0;
        for (int64_t c = 0; c < view.cols; ++c) {
          want += double(w[c]) * Bf16ToF32(x[n][c]);
          mag += std::fabs(double(w[c]) * Bf16ToF32(x[n][c]));
        }
        ASSERT_NEAR(got[r][n], want, 1e-5 * mag + 1e-30) << "slice " << s << " row " << r << " token " << n;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, view.rows * 8);
}

// 48 rows (3 slices) × 512 columns (2 chunks) viewed at column 64 of 608 stored ones.
constexpr int64_t kRows = 48, kCols = 512, kOffset = 64, kStored = 608;

WeightRef View(WeightFormat f, const std::vector<uint8_t>& data, int64_t stride) {
  WeightRef v;
  v.format = f;
  v.rows = kRows;
  v.cols = kCols;
  v.col_offset = kOffset;
  v.data = data.data();
  v.row_stride_bytes = stride;
  return v;
}

template <bool kMx>
Repacked RepackE2m1(const WeightRef& v) {
  // Every scale byte is written: the buffer starts poisoned (a NaN scale for NVFP4, 2^128 for MXFP4).
  Repacked rp{std::vector<uint8_t>(v.rows * v.cols / 2), std::vector<uint8_t>(v.rows * v.cols / (kMx ? 32 : 16), 0xFF),
              v.cols / 256};
  for (int64_t o = 0; o < v.rows * v.cols / 8; ++o) {
    E2m1RepackWord<kMx>(v, o, reinterpret_cast<uint32_t*>(rp.codes.data()),
                        reinterpret_cast<uint32_t*>(rp.scales.data()));
  }
  return rp;
}

TEST(MoeStreamLayoutTest, Nvfp4RepackReadByALaneComputesTheProduct) {
  std::mt19937 rng(31);
  std::vector<uint8_t> data(kRows * kStored / 2), scale(kRows * kStored / 16);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  // e4m3 block scales: positive, finite, zero and subnormal ones among them.
  for (auto& b : scale) b = static_cast<uint8_t>(rng() % 0x7F);
  WeightRef v = View(WeightFormat::kNVFP4, data, kStored / 2);
  v.scale = scale.data();
  v.scale_row_stride = kStored / 16;
  v.scale2 = 0.0123f;
  const Repacked rp = RepackE2m1<false>(v);
  const auto x = Tokens(kCols, rng);
  ExpectProduct(v, x, [&](int64_t s, float(&got)[16][8]) { EmulateE2m1(rp, s, false, v.scale2, x, got); });
}

constexpr int64_t kMxStride = kStored / 32 * 17, kQ8Stride = kStored / 32 * 34;

// Stored MXFP4 rows: random codes, e8m0 scales in the repack's exact range (its ends too).
std::vector<uint8_t> Mxfp4Data(std::mt19937& rng) {
  std::vector<uint8_t> data(kRows * kMxStride);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t blk = 0; blk < kStored / 32; ++blk) {
      const int pick = static_cast<int>(rng() % 8);
      data[r * kMxStride + blk * 17] = static_cast<uint8_t>(pick == 0 ? 3 : pick == 1 ? 136 : 100 + rng() % 37);
    }
  }
  return data;
}

// Stored Q8_0 rows: random codes, fp16 d of either sign.
std::vector<uint8_t> Q8Data(std::mt19937& rng) {
  std::vector<uint8_t> data(kRows * kQ8Stride);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t blk = 0; blk < kStored / 32; ++blk) {
      uint8_t* p = data.data() + r * kQ8Stride + blk * 34;
      const uint16_t d = F32ToF16(blk % 7 == 3 ? -scale(rng) : scale(rng));  // a negative d too
      std::memcpy(p, &d, 2);
      for (int i = 0; i < 32; ++i) p[2 + i] = static_cast<uint8_t>(rng());
    }
  }
  return data;
}

Repacked RepackQ8(const WeightRef& v) {
  Repacked rp{std::vector<uint8_t>(kRows * kCols), std::vector<uint8_t>(kRows * kCols / 16), kCols / 256};
  for (int64_t chunk = 0; chunk < kRows / 16 * rp.chunks; ++chunk) {
    for (int g4 = 0; g4 < kQ8StreamSliceBytes / 4; ++g4) {
      Q8StreamRepackGroup(v, chunk, g4, rp.codes.data(), rp.scales.data());
    }
  }
  return rp;
}

TEST(MoeStreamLayoutTest, Mxfp4RepackReadByALaneComputesTheProduct) {
  std::mt19937 rng(32);
  const std::vector<uint8_t> data = Mxfp4Data(rng);
  const WeightRef v = View(WeightFormat::kMXFP4, data, kMxStride);
  const Repacked rp = RepackE2m1<true>(v);
  const auto x = Tokens(kCols, rng);
  ExpectProduct(v, x, [&](int64_t s, float(&got)[16][8]) { EmulateE2m1(rp, s, true, 1.f, x, got); });
}

TEST(MoeStreamLayoutTest, Q8RepackReadByALaneComputesTheProduct) {
  std::mt19937 rng(21);
  const std::vector<uint8_t> data = Q8Data(rng);
  const WeightRef v = View(WeightFormat::kQ8_0, data, kQ8Stride);
  const Repacked rp = RepackQ8(v);
  // Every code byte written exactly once: the repack is a permutation of the view's codes.
  std::vector<uint8_t> got = rp.codes, want;
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = kOffset; c < kOffset + kCols; ++c) want.push_back(data[r * kQ8Stride + c / 32 * 34 + 2 + c % 32]);
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
  const auto x = Tokens(kCols, rng);
  ExpectProduct(v, x, [&](int64_t s, float(&out)[16][8]) { EmulateQ8(rp, s, x, out); });
}

// The int8 layout's offsets agree with each other: lane (g, c)'s 16 bytes of block b are row g's then
// row g + 8's codes of columns 32b + 8c .., and its scales of blocks 2q, 2q + 1 rows g, g + 8 of each.
TEST(MoeStreamLayoutTest, Q8LaneOffsetsNameTheLayoutsBytes) {
  for (int b = 0; b < 8; ++b) {
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4, c = lane % 4;
      for (int i = 0; i < 8; ++i) {
        EXPECT_EQ(Q8StreamLaneCodes(b, lane) + i, Q8StreamCodeByte(g, 32 * b + 8 * c + i));
        EXPECT_EQ(Q8StreamLaneCodes(b, lane) + 8 + i, Q8StreamCodeByte(g + 8, 32 * b + 8 * c + i));
      }
      EXPECT_EQ(Q8StreamLaneB(b, lane), 2 * (32 * b + 8 * c));
    }
  }
  for (int q = 0; q < 4; ++q) {
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4;
      EXPECT_EQ(Q8StreamLaneScales(q, lane) + 0, Q8StreamScaleByte(g, 2 * q));
      EXPECT_EQ(Q8StreamLaneScales(q, lane) + 2, Q8StreamScaleByte(g + 8, 2 * q));
      EXPECT_EQ(Q8StreamLaneScales(q, lane) + 4, Q8StreamScaleByte(g, 2 * q + 1));
      EXPECT_EQ(Q8StreamLaneScales(q, lane) + 6, Q8StreamScaleByte(g + 8, 2 * q + 1));
    }
  }
}

// The lane emulations on worked values: int8 codes to bf16 exactly, fp16 scales to fp32 exactly
// (normal, subnormal, negative).
TEST(MoeStreamLayoutTest, LaneDecodesOnWorkedValues) {
  uint32_t lo, hi;
  lane::I8x4ToBf16(0x7F80FF01u, lo, hi);  // bytes 1, -1, -128, 127
  EXPECT_EQ(Lo(lo), 1.f);
  EXPECT_EQ(Hi(lo), -1.f);
  EXPECT_EQ(Lo(hi), -128.f);
  EXPECT_EQ(Hi(hi), 127.f);
  float a, b;
  F16x2ToF32(0x80013C00u, a, b);  // 1.0, then -2^-24 (the smallest subnormal, negative)
  EXPECT_EQ(a, 1.f);
  EXPECT_EQ(b, -std::ldexp(1.f, -24));
  F16x2ToF32(0x7BFF0400u, a, b);  // 2^-14 (the smallest normal), 65504
  EXPECT_EQ(a, std::ldexp(1.f, -14));
  EXPECT_EQ(b, 65504.f);
}

// The prefill expansion's read of a repacked matrix (RepackedRowBlock, moe_wgmma.cu's ExpandKernel
// over MXFP4 and Q8_0 experts in the streaming layouts) gives every row's 32-column blocks exactly
// as the stored blocks' decode does (block_decode::DecodeBlock, the expansion of stored experts):
// the same bf16 bits, so a prefill step's results do not depend on the layout.
void ExpectRowBlocksAsStored(const WeightRef& v, const Repacked& rp, bool q8) {
  const int64_t bytes = q8 ? 34 : 17, stride = v.row_stride_bytes;
  int bad = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t b = 0; b < kCols / 32; ++b) {
      uint32_t words[block_decode::kRawWords] = {}, want[16], got[16];
      std::memcpy(words, v.data + r * stride + (kOffset / 32 + b) * bytes, bytes);
      block_decode::DecodeBlock(v.format, words, 0, want);
      RepackedRowBlock(rp.codes.data(), rp.scales.data(), kCols, q8, r, b, got);
      for (int i = 0; i < 16; ++i) {
        if (got[i] != want[i] && bad++ < 5) {
          ADD_FAILURE() << "row " << r << " block " << b << " pair " << i << ": " << std::hex << got[i]
                        << " != " << want[i];
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(MoeStreamLayoutTest, RepackedRowBlocksAreTheStoredBlocks) {
  std::mt19937 rng(41);
  const std::vector<uint8_t> mx = Mxfp4Data(rng), q8 = Q8Data(rng);
  const WeightRef vm = View(WeightFormat::kMXFP4, mx, kMxStride), vq = View(WeightFormat::kQ8_0, q8, kQ8Stride);
  ExpectRowBlocksAsStored(vm, RepackE2m1<true>(vm), false);
  ExpectRowBlocksAsStored(vq, RepackQ8(vq), true);
}

}  // namespace
}  // namespace moeshard::gpu

// The wgmma GEMMs over repacked e2m1 experts (moe_stream_wgmma.cu) store each 64-column quad of the
// activations permuted so that wgmma's k16 step u reads, at k index kk, the column that the weights'
// A fragment holds there (lane c: 2c, 2c + 1 -> columns 16c + 4u, + 1; 2c + 8, 2c + 9 -> 16c + 4u + 2,
// + 3; the layout the streaming kernels' mma.sync loop reads). The gather's pair table and the
// epilogue's position function must both put every column there, and be one-to-one.
TEST(MoeStreamLayoutTest, WgmmaActivationOrderMatchesTheFragments) {
  std::vector<int> seen(128, 0);
  for (int i = 0; i < 128; ++i) {
    const int p = moeshard::gpu::StreamWgmmaPos(i);
    ASSERT_GE(p, i & ~63);
    ASSERT_LT(p, (i & ~63) + 64);
    ++seen[p];
  }
  for (int p = 0; p < 128; ++p) EXPECT_EQ(seen[p], 1) << "position " << p;
  for (int u = 0; u < 4; ++u) {
    for (int c = 0; c < 4; ++c) {
      for (int j = 0; j < 4; ++j) {
        const int kk = 2 * c + (j & 1) + 8 * (j >> 1), col = 16 * c + 4 * u + j;
        EXPECT_EQ(moeshard::gpu::StreamWgmmaPos(col), 16 * u + kk) << "u " << u << " lane c " << c << " j " << j;
      }
    }
  }
  for (int op = 0; op < 32; ++op) {
    const int r = moeshard::gpu::StreamWgmmaGatherPair(op);
    EXPECT_EQ(moeshard::gpu::StreamWgmmaPos(2 * r), 2 * op) << "pair " << op;
    EXPECT_EQ(moeshard::gpu::StreamWgmmaPos(2 * r + 1), 2 * op + 1) << "pair " << op;
  }
}

// The item size of the wgmma GEMMs over decoded registers, at the shapes it was measured on
// (kernels/moe/PERF_NOTES.md): R + 1.5 sqrt(R) rows of an expert rounded up to 32, 64, 96, 112 or 128.
TEST(MoeStreamLayoutTest, WgmmaItemTokensHoldTheExpectedRows) {
  using moeshard::gpu::StreamWgmmaItemTokens;
  EXPECT_EQ(StreamWgmmaItemTokens(753 * 8, 256), 32);    // Muse Spark, 23.5 rows: 30.8 (the pair step; 64 without)
  EXPECT_EQ(StreamWgmmaItemTokens(800 * 8, 256), 64);    // 25 rows: 32.5
  EXPECT_EQ(StreamWgmmaItemTokens(3012 * 8, 256), 112);  // 94.1 rows: 108.7 (112 measured ahead of 128)
  EXPECT_EQ(StreamWgmmaItemTokens(4096 * 8, 256), 128);  // 128 rows: 145.0
  EXPECT_EQ(StreamWgmmaItemTokens(8192 * 8, 256), 128);  // 256 rows: two items and a tail
  EXPECT_EQ(StreamWgmmaItemTokens(1024 * 8, 128), 96);   // Qwen3-30B, 64 rows: 76
  EXPECT_EQ(StreamWgmmaItemTokens(200 * 4, 16), 64);     // moe_expert_test's "stream wgmma": 50 rows, 60.6
  EXPECT_EQ(StreamWgmmaItemTokens(90 * 16, 16), 112);    // 90 rows: 104.2
  EXPECT_EQ(StreamWgmmaItemTokens(100 * 16, 16), 128);   // 100 rows: 115
  EXPECT_EQ(StreamWgmmaItemTokens(0, 256), 32);          // no rows: the smallest (the pair step's; 64 without it)
  EXPECT_EQ(StreamWgmmaItemTokens(100, 0), 128);         // no experts counted: read as one
}

// Which experts take those GEMMs (moe_expert.cc reads the thresholds from the environment; these
// are its defaults at Muse Spark's shape on one GPU: 32 local experts, all from 20 rows an expert,
// the split from 4 at 24 rows).
TEST(MoeStreamLayoutTest, WgmmaPlanSplitsBelowTheAverageThatTakesAll) {
  using moeshard::gpu::PlanStreamWgmma;
  const auto at = [](int64_t rows) { return PlanStreamWgmma(32, rows, 20 * 32, 24, 4); };
  EXPECT_TRUE(at(753 * 8 / 8).all);  // T = 753: 23.5 rows an expert
  EXPECT_EQ(at(753 * 8 / 8).split_rows, 0);
  EXPECT_TRUE(at(640).all);  // exactly 20 an expert
  EXPECT_FALSE(at(639).all);
  EXPECT_EQ(at(639).split_rows, 24);
  EXPECT_EQ(at(256).split_rows, 24);  // T = 256: 8 rows an expert on average
  EXPECT_EQ(at(128).split_rows, 24);  // 4 an expert: the split's lower end
  EXPECT_EQ(at(127).split_rows, 0);   // decode sizes stay on the streaming kernels
  EXPECT_FALSE(at(127).all);
  EXPECT_EQ(at(0).split_rows, 0);
  // split_rows 0 turns the split off; all_from <= 1 sends every step with a row to the GEMMs.
  EXPECT_EQ(PlanStreamWgmma(32, 256, 640, 0, 4).split_rows, 0);
  EXPECT_FALSE(PlanStreamWgmma(32, 256, 640, 0, 4).all);
  EXPECT_TRUE(PlanStreamWgmma(32, 1, 1, 24, 4).all);
  EXPECT_FALSE(PlanStreamWgmma(32, 0, 0, 24, 4).all);  // a step without rows: neither
  EXPECT_EQ(PlanStreamWgmma(32, 0, 0, 24, 0).split_rows, 0);
  // moe_expert_test's split variant: the "stream wgmma" shape (10 local experts, ~50 rows each)
  // with the all-threshold out of reach and the split at 48 rows.
  EXPECT_EQ(PlanStreamWgmma(10, 500, 1000000, 48, 4).split_rows, 48);
}
