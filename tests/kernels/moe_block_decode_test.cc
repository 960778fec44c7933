// kernels/moe/moe_block_decode.h (the wgmma path's expansion pass) on the CPU against
// kernels/cpu/dequant: every Q8_0 and MXFP4 block at each byte offset within its first word,
// with its neighbours' bytes around it, must give the reference's values rounded to bf16 (to
// nearest, ties to even) bit for bit; MXFP4 values are exact in bf16, so there the bf16 equals
// the fp32 reference. Also the host emulations of the device instructions on worked examples.
#include "kernels/moe/moe_block_decode.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/dequant.h"

namespace moeshard {
namespace {

using block_decode::DecodeBlock;

// The 32 decoded values of the block whose bytes start `off` bytes into a word-aligned buffer.
std::vector<uint16_t> Decode(WeightFormat fmt, const std::vector<uint8_t>& block, int off, std::mt19937& rng) {
  std::vector<uint8_t> buf(4 * block_decode::kRawWords + 8);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());  // neighbours: whatever the row holds
  std::memcpy(buf.data() + off, block.data(), block.size());
  uint32_t w[block_decode::kRawWords + 2];
  std::memcpy(w, buf.data(), sizeof(w));
  uint32_t out[16];
  DecodeBlock(fmt, w, off, out);
  std::vector<uint16_t> v(32);
  for (int i = 0; i < 16; ++i) {
    v[2 * i] = static_cast<uint16_t>(out[i] & 0xffff);
    v[2 * i + 1] = static_cast<uint16_t>(out[i] >> 16);
  }
  return v;
}

TEST(MoeBlockDecodeTest, Mxfp4MatchesTheReferenceAtEveryOffset) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> block(17);
    // Scales across the checkpoints' range and the edges (2^-127 as 0, large exponents).
    const int pick = trial % 8;
    block[0] = static_cast<uint8_t>(pick == 0 ? 0 : pick == 1 ? 254 : pick == 2 ? 127 : 100 + rng() % 40);
    for (int i = 1; i < 17; ++i) block[i] = static_cast<uint8_t>(rng());
    float want[32];
    DequantMxfp4Block(block.data(), want);
    for (int off = 0; off < 4; ++off) {
      const std::vector<uint16_t> got = Decode(WeightFormat::kMXFP4, block, off, rng);
      for (int c = 0; c < 32; ++c) {
        ASSERT_EQ(got[c], F32ToBf16(want[c])) << "scale " << int(block[0]) << " offset " << off << " column " << c
                                              << ": want " << want[c] << ", got " << Bf16ToF32(got[c]);
        ASSERT_EQ(Bf16ToF32(got[c]), want[c]) << "MXFP4 values are exact in bf16";
      }
    }
  }
}

TEST(MoeBlockDecodeTest, Q8_0MatchesTheReferenceRoundedToBf16AtEveryOffset) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> scale(-3e-3f, 3e-3f);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> block(34);
    // d: a realistic f16 scale, or a subnormal one, or a large one.
    const float df = trial % 10 == 0 ? 3e-6f : trial % 10 == 1 ? 900.f : scale(rng);
    const uint16_t d = F32ToF16(df);
    block[0] = static_cast<uint8_t>(d & 0xff);
    block[1] = static_cast<uint8_t>(d >> 8);
    for (int i = 2; i < 34; ++i) block[i] = static_cast<uint8_t>(rng());
    block[2] = 0x80;  // -128 once in every block
    float want[32];
    DequantQ8_0Block(block.data(), want);
    for (int off = 0; off < 4; ++off) {
      const std::vector<uint16_t> got = Decode(WeightFormat::kQ8_0, block, off, rng);
      for (int c = 0; c < 32; ++c) {
        ASSERT_EQ(got[c], F32ToBf16(want[c])) << "d " << df << " offset " << off << " column " << c;
      }
    }
  }
}

TEST(MoeBlockDecodeTest, Bf16IsCopied) {
  std::mt19937 rng(13);
  std::vector<uint8_t> block(64);
  for (auto& b : block) b = static_cast<uint8_t>(rng());
  const std::vector<uint16_t> got = Decode(WeightFormat::kBF16, block, 0, rng);
  EXPECT_EQ(std::memcmp(got.data(), block.data(), 64), 0);
}

// The host versions of the device instructions, on values worked out by hand.
TEST(MoeBlockDecodeTest, HostInstructionsMatchTheirDefinitions) {
  using namespace block_decode;
  EXPECT_EQ(BytePerm(0x44332211u, 0, 0x4140), 0x00220011u);  // bytes 0 and 1 into the halves
  EXPECT_EQ(BytePerm(0x44332211u, 0, 0x4342), 0x00440033u);
  EXPECT_EQ(BytePerm(0x44332211u, 0x88776655u, 0x7654), 0x88776655u);
  EXPECT_EQ(FunnelShiftR(0x44332211u, 0x88776655u, 8), 0x55443322u);
  EXPECT_EQ(FunnelShiftR(0x44332211u, 0x88776655u, 0), 0x44332211u);
  EXPECT_EQ(FunnelShiftR(0x44332211u, 0x88776655u, 24), 0x77665544u);
  // bf16 pairs: 1.5 * 2 = 3 and -0.5 * 2 = -1; the subnormal 2^-127 * 2^126 = 0.5.
  EXPECT_EQ(MulBf16x2(0xBF003FC0u, 0x40004000u), 0xBF804040u);
  EXPECT_EQ(MulBf16x2(0x00000040u, 0x7E807E80u) & 0xffff, 0x3F00u);
  EXPECT_EQ(block_decode::F16ToF32(0x3C00), 1.0f);
  EXPECT_EQ(block_decode::F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(ToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // a tie goes to even
  EXPECT_EQ(ToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
}

}  // namespace
}  // namespace moeshard
