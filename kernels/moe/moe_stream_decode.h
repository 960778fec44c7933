// The streaming kernels' repacks and decodes, host and device alike (kernels/cuda/lane_ops.h):
// what the repack kernels write for each output word and what a consumer lane makes of the words
// it reads — the e2m1 layout of moe_stream.cuh (NVFP4, MXFP4) and the int8 layout of
// moe_q8_stream_layout.h (Q8_0). The kernels (moe_stream.cuh, moe_nvfp4_stream.cu,
// moe_q8_stream.cu, moe_stream_direct.cu) call these functions; so does
// tests/kernels/moe_stream_layout_test.cc, which reads repacked matrices the way a lane does and
// multiplies them by the m16n8k16 fragment rules on the CPU. Free of CUDA headers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/weight_ref.h"
#include "kernels/cuda/lane_ops.h"
#include "kernels/moe/moe_block_decode.h"
#include "kernels/moe/moe_q8_stream_layout.h"

namespace moeshard::gpu {

// ---- e2m1 (NVFP4, MXFP4) ------------------------------------------------------------------
// The layout: moe_stream.cuh's header. A chunk (16 rows × 256 columns) is 512 words of codes:
// word (q · 32 + lane) · 4 + wi holds, for quad q and lane (g, c), the 8 codes of row g + 8·(wi & 1),
// columns 64q + 16c + 8·(wi >> 1) .. + 7, bits shuffled (E2m1RepackBit); and a lane's scale word
// for each pair of quads (q even) holding the scale bytes of (quad q, row g), (q, g + 8), (q + 1,
// g), (q + 1, g + 8) for the lane's 16 columns, at E2m1ScaleWord: NVFP4's 64 words a chunk (one
// per lane and pair), MXFP4's 32 (lanes c and c ^ 1 share their 32-column block and its word).
constexpr int kE2m1ChunkWords = 512;

// Scale bytes of a 16-row × 256-column chunk: NVFP4 one per 16 columns, MXFP4 one per 32.
MOESHARD_LANE_HD constexpr int E2m1ScaleBytes(bool mx) { return mx ? 128 : 256; }

// Byte offset, in a chunk's scales, of lane `lane`'s word for quads q & ~1 and q | 1.
MOESHARD_LANE_HD constexpr int E2m1ScaleWord(int lane, int q, bool mx) {
  return mx ? (((lane >> 2) * 2 + ((lane & 3) >> 1)) * 2 + (q >> 1)) * 4 : lane * 8 + (q >> 1) * 4;
}

// The 4 bf16x2 slots of a repacked word, times s2 (moe_device.cuh: e2m1 · 2^-126 · s2).
// Six LOP3 (the ALU pipe, the one that bounds this loop) and five shifts written as integer
// multiplies (IMAD, the FMA pipe): slots 1 and 3 are whole shifts of the word, slots 0 and
// 2 take their magnitude and sign bits from two different shifts.
MOESHARD_LANE_HD void DecodeRepacked(uint32_t w, uint32_t s2, uint32_t out[4]) {
  constexpr uint32_t kEm = 0x01C001C0u, kSign = 0x80008000u, kAll = kEm | kSign;
  out[0] = lane::MulBf16x2((lane::MulHi(w, 1u << 26) & kEm) | ((w * 16u) & kSign), s2);  // w >> 6, w << 4
  out[1] = lane::MulBf16x2(w & kAll, s2);
  out[2] = lane::MulBf16x2(((w * 8u) & kEm) | ((w * 32u) & kSign), s2);  // w << 3, w << 5
  out[3] = lane::MulBf16x2((w * 64u) & kAll, s2);                        // w << 6
}

// Bit b of a repacked word comes from bit E2m1RepackBit(b) of the stored word (code i at bits
// 4i..4i+3, sign on top). Derived from DecodeRepacked: slot j, half h (code 2j + h) has its
// magnitude bits where shifting left by (-6, 0, 3, 6)[j] puts them at 6..8 + 16h and its
// sign where shifting by (4, 0, 5, 6)[j] puts it at 15 + 16h.
MOESHARD_LANE_HD int E2m1RepackBit(int b) {
  constexpr uint8_t kBit[32] = {24, 25, 26, 16, 17, 18, 8,  9,  10, 27, 19, 3, 0, 1, 2, 11,
                                28, 29, 30, 20, 21, 22, 12, 13, 14, 31, 23, 7, 4, 5, 6, 15};
  return kBit[b];
}

// Quad q's scales of rows g and g + 8 as bf16 pairs s2[0] (row g in both halves) and s2[1] (row
// g + 8), from the lane's scale word `sc` (quads q & ~1 and q | 1): NVFP4's e4m3 · 2^-120 per half
// times 2^238, or (mx) MXFP4's e8m0 exponent put in place as a bf16 exponent.
MOESHARD_LANE_HD void E2m1ScalePair(uint32_t sc, int q, bool mx, uint32_t s2[2]) {
  constexpr uint32_t k2p119 = 0x7B007B00u;
  const uint32_t pair = lane::BytePerm(sc, 0, (q & 1) == 0 ? 0x4140 : 0x4342);  // rows g, g+8
  const uint32_t both = mx ? pair << 7 : lane::MulBf16x2(lane::MulBf16x2(pair << 4, k2p119), k2p119);
  s2[0] = lane::BytePerm(both, 0, 0x1010);
  s2[1] = lane::BytePerm(both, 0, 0x3232);
}

// The stored codes of columns col .. col + 7 of a row (col a multiple of 8), code i at bits
// 4i .. 4i + 3: NVFP4 packs two columns a byte; MXFP4's 17-byte blocks hold the e8m0 scale, then
// in byte j column j (low nibble) and column j + 16 (high).
template <bool kMx>
MOESHARD_LANE_HD uint32_t E2m1StoredCodes(const WeightRef& src, int64_t row, int64_t col) {
  const uint8_t* rp = src.data + row * src.row_stride_bytes;
  if constexpr (kMx) {
    const int j0 = static_cast<int>(col % 32);
    const uint8_t* b = rp + col / 32 * 17 + 1 + (j0 & 15);
    uint32_t in = 0;
    for (int i = 0; i < 8; ++i) in |= uint32_t{j0 < 16 ? b[i] & 15u : b[i] >> 4u} << (4 * i);
    return in;
  } else {
    const uint8_t* b = rp + col / 2;
    return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
  }
}

// The repacked scale byte of the 16 columns from col16: NVFP4's e4m3 without its sign; MXFP4's
// 32-column block's e8m0 exponent s as s + 118 (moe_stream.cuh's header: MoeWork::stream_mx).
template <bool kMx>
MOESHARD_LANE_HD uint32_t E2m1StoredScale(const WeightRef& src, int64_t row, int64_t col16) {
  if constexpr (kMx) return uint32_t{src.data[row * src.row_stride_bytes + col16 / 32 * 17]} + 118u;
  return src.scale[row * src.scale_row_stride + col16 / 16] & 0x7Fu;
}

// Output word o of the repack of `src` (numbered chunk by chunk, slice by slice, cols / 256
// chunks a slice), and for the words that start a lane's pair of quads, its scale word.
template <bool kMx>
MOESHARD_LANE_HD void E2m1RepackWord(const WeightRef& src, int64_t o, uint32_t* dst_data, uint32_t* dst_scale) {
  const int64_t chunks = src.cols / 256;
  const int64_t chunk = o / kE2m1ChunkWords;
  const int within = static_cast<int>(o % kE2m1ChunkWords);
  const int q = within / 128, ln = (within / 4) % 32, wi = within % 4;
  const int j = wi >> 1, h = wi & 1, g = ln >> 2, c = ln & 3;
  const int64_t s = chunk / chunks, kc = chunk % chunks;
  const int64_t row = 16 * s + g + 8 * h, col = src.col_offset + kc * 256 + q * 64 + 16 * c + 8 * j;
  const uint32_t in = E2m1StoredCodes<kMx>(src, row, col);
  uint32_t out = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int bit = 0; bit < 32; ++bit) out |= ((in >> E2m1RepackBit(bit)) & 1u) << bit;
  dst_data[o] = out;
  if (wi == 0 && (q & 1) == 0 && (!kMx || (c & 1) == 0)) {  // the lane's scale bytes of quads q, q + 1
    uint32_t sc = 0;
    for (int i = 0; i < 4; ++i) {
      const int qq = q + (i >> 1), hh = i & 1;
      const int64_t r = 16 * s + g + 8 * hh, col16 = src.col_offset + kc * 256 + qq * 64 + 16 * c;
      sc |= E2m1StoredScale<kMx>(src, r, col16) << (8 * i);
    }
    dst_scale[(chunk * E2m1ScaleBytes(kMx) + E2m1ScaleWord(ln, q, kMx)) / 4] = sc;
  }
}

// ---- int8 (Q8_0) ---------------------------------------------------------------------------

// A lane's 16 code bytes of one 32-column block (words v0..v3: row g's columns 8c .. 8c + 3,
// 8c + 4 .. 8c + 7, then row g + 8's) as the A registers of the block's two k16 steps:
// a[t] = {a0, a1, a2, a3} of step t, each code exact in bf16.
MOESHARD_LANE_HD void Q8LaneFragments(uint32_t v0, uint32_t v1, uint32_t v2, uint32_t v3, uint32_t a[2][4]) {
  lane::I8x4ToBf16(v0, a[0][0], a[0][2]);  // row g, columns 8c .. 8c + 3: step 0
  lane::I8x4ToBf16(v2, a[0][1], a[0][3]);  // row g + 8
  lane::I8x4ToBf16(v1, a[1][0], a[1][2]);  // columns 8c + 4 .. 8c + 7: step 1
  lane::I8x4ToBf16(v3, a[1][1], a[1][3]);
}

// Two fp16 scales (low half first) as fp32, exactly: the magnitude bits moved into place are the
// value · 2^-112 (subnormals too), the multiply restores it. An infinite or NaN scale (never in a
// checkpoint) reads as a large finite one.
MOESHARD_LANE_HD void F16x2ToF32(uint32_t x, float& lo, float& hi) {
  lo = lane::Bits(lane::FloatBits(lane::Bits((x & 0x7fffu) << 13) * 0x1p112f) | ((x & 0x8000u) << 16));
  hi = lane::Bits(lane::FloatBits(lane::Bits((x >> 3) & 0x0fffe000u) * 0x1p112f) | (x & 0x80000000u));
}

// ---- a row's 32-column block, for the prefill expansion (moe_wgmma.cu) ----------------------------

// Row `row`, columns 32b .. 32b + 31 of a repacked MXFP4 or (q8) Q8_0 matrix of `cols` columns
// (`data`, `scale`: the repack's outputs) as 16 bf16 pairs, columns (2i, 2i + 1) in out[i]: the
// stored block's values exactly as block_decode::DecodeBlock gives them — MXFP4's e2m1 · 2^(s-127)
// (DecodeRepacked's e2m1 · 2^-126 times the layout's scale 2^(s-9), then 2^8: exact in bf16, the
// repack's exact range), Q8_0's d · q in fp32 rounded to bf16. NVFP4 is not taken: its values
// times scale2 round.
MOESHARD_LANE_HD void RepackedRowBlock(const uint8_t* data, const uint8_t* scale, int64_t cols, bool q8, int64_t row,
                                       int64_t b, uint32_t out[16]) {
  const int64_t chunk = row / 16 * (cols / 256) + b / 8;
  const int r = static_cast<int>(row % 16), bb = static_cast<int>(b % 8);
  if (q8) {
    const uint8_t* codes = data + chunk * kQ8StreamSliceBytes;
    const uint8_t* sp = scale + chunk * kQ8StreamSliceScaleBytes + Q8StreamScaleByte(r, bb);
    const float d = block_decode::F16ToF32(static_cast<uint16_t>(sp[0] | sp[1] << 8));
    for (int i = 0; i < 16; ++i) {
      const int k = 32 * bb + 2 * i;
      const float v0 = d * static_cast<float>(static_cast<int8_t>(codes[Q8StreamCodeByte(r, k)]));
      const float v1 = d * static_cast<float>(static_cast<int8_t>(codes[Q8StreamCodeByte(r, k + 1)]));
      out[i] = uint32_t{lane::ToBf16(v0)} | (uint32_t{lane::ToBf16(v1)} << 16);
    }
    return;
  }
  constexpr uint32_t k2p8 = 0x43804380u;  // 2^8 in both halves
  const int g = r % 8, h = r / 8, q = bb / 2;
  const uint8_t* words = data + chunk * kE2m1ChunkWords * 4;
  for (int cc = 0; cc < 2; ++cc) {  // the block's two lanes of 16 columns
    const int ln = 4 * g + 2 * (bb % 2) + cc;
    uint32_t sc = 0, s2[2];
    std::memcpy(&sc, scale + chunk * E2m1ScaleBytes(true) + E2m1ScaleWord(ln, q, true), 4);
    E2m1ScalePair(sc, q, true, s2);
    for (int j = 0; j < 2; ++j) {  // word 2j + h: row g + 8h, columns 16cc + 8j .. + 7
      uint32_t w = 0, d[4];
      std::memcpy(&w, words + ((q * 32 + ln) * 4 + 2 * j + h) * 4, 4);
      DecodeRepacked(w, s2[h], d);
      for (int k = 0; k < 4; ++k) out[8 * cc + 4 * j + k] = lane::MulBf16x2(d[k], k2p8);
    }
  }
}

// ---- the activations of the wgmma GEMMs over repacked e2m1 experts (moe_stream_wgmma.cu) --------
// wgmma reads B's k16 step u of a 64-column quad from positions 16u .. 16u + 15 of each token's
// row, and the weights' A fragment of lane c holds, at k index 2c + (j & 1) + 8 (j >> 1), column
// 16c + 4u + j of the quad (the layout above). So column i of a quad is stored at this position.
MOESHARD_LANE_HD constexpr int StreamWgmmaPos(int i) {
  return (i & ~63) + 16 * ((i >> 2) & 3) + 2 * ((i & 63) >> 4) + (i & 1) + 8 * ((i >> 1) & 1);
}
// The gather's form of the same: the 32-bit column pair at position pair `op` (0..31) of a quad
// (positions 2 op, 2 op + 1) is the input pair returned (columns 2 r, 2 r + 1).
MOESHARD_LANE_HD constexpr int StreamWgmmaGatherPair(int op) { return 8 * (op & 3) + 2 * (op >> 3) + ((op >> 2) & 1); }

// Tokens an item of those GEMMs takes at most (their kernels' larger accumulator shape: 64, 96, 112
// or 128; an expert's rows past it go to further items, at the 32-token shape when 32 or fewer are
// left; 32: the two-CTA 32-token kernel beside the 128-token one, MoeWork::sw_pair): the smallest
// that holds the expected rows of an expert one and a half standard deviations up, R + 1.5 sqrt(R)
// with R = capacity / all experts (the host cannot see the route's counts). A further item decodes
// and streams the expert's weights again; a larger shape idles MMA columns — at Muse Spark's 94
// rows an expert 128 measured ahead of 96 and 112 ahead of 128 (7 %), at 256 rows 128 ahead of 112
// (kernels/moe/PERF_NOTES.md).
inline int StreamWgmmaItemTokens(int64_t capacity, int64_t total_experts) {
  const double rows = static_cast<double>(capacity) / static_cast<double>(total_experts > 0 ? total_experts : 1);
  const double need = rows + 1.5 * std::sqrt(rows > 0 ? rows : 0.0);
  return need <= 32 ? 32 : need <= 64 ? 64 : need <= 96 ? 96 : need <= 112 ? 112 : 128;
}

// Which repacked NVFP4 / MXFP4 experts of a prefill-sized step take those GEMMs, from the rows the
// host expects this GPU to hold (`rows`, all local experts together; the route's counts stay on the
// device): every expert from `all_from` rows up; below that, from an average of `split_from` rows an
// expert, each expert by its own count — the route gives those with at least `split_rows` rows to
// the GEMMs and the rest to the streaming kernels, in the same step (skewed routing leaves a few hot
// experts with hundreds of rows beside many with a handful, which the average hides). split_rows 0:
// no split.
struct StreamWgmmaPlan {
  bool all = false;        // every expert through the wgmma GEMMs
  int32_t split_rows = 0;  // > 0: experts with at least this many rows through them, the rest streamed
};
inline StreamWgmmaPlan PlanStreamWgmma(int64_t experts, int64_t rows, int64_t all_from, int64_t split_rows,
                                       int64_t split_from) {
  StreamWgmmaPlan plan;
  if (rows >= (all_from > 1 ? all_from : 1)) {
    plan.all = true;
  } else if (split_rows > 0 && split_rows < (int64_t{1} << 30) && rows >= split_from * experts && rows > 0) {
    plan.split_rows = static_cast<int32_t>(split_rows);
  }
  return plan;
}

}  // namespace moeshard::gpu
