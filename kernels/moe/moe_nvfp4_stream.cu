// The streaming kernels (moe_stream.cuh) for e2m1 codes: NVFP4 and MXFP4 experts repacked by
// MoeRepackNvfp4 / MoeRepackMxfp4, the repack itself and the MXFP4 scale-range check.
#include <algorithm>

#include "kernels/moe/moe_stream.cuh"

namespace moeshard::gpu {
namespace {

using moe_stream::kKc;
using moe_stream::kQuads;
using moe_stream::SliceData;

// Bit b of a repacked word comes from bit kRepackBit[b] of the stored word (code i at bits
// 4i..4i+3, sign on top). Derived from DecodeRepacked: slot j, half h (code 2j + h) has its
// magnitude bits where shifting left by (-6, 0, 3, 6)[j] puts them at 6..8 + 16h and its
// sign where shifting by (4, 0, 5, 6)[j] puts it at 15 + 16h.
__constant__ uint8_t kRepackBit[32] = {24, 25, 26, 16, 17, 18, 8,  9,  10, 27, 19, 3, 0, 1, 2, 11,
                                       28, 29, 30, 20, 21, 22, 12, 13, 14, 31, 23, 7, 4, 5, 6, 15};

// ---- repack ------------------------------------------------------------------------------

// The stored codes of columns col .. col + 7 of a row (col a multiple of 8), code i at bits
// 4i .. 4i + 3: NVFP4 packs two columns a byte; MXFP4's 17-byte blocks hold the e8m0 scale, then
// in byte j column j (low nibble) and column j + 16 (high).
template <bool kMx>
__device__ __forceinline__ uint32_t StoredCodes(const WeightRef& src, int64_t row, int64_t col) {
  const uint8_t* rp = src.data + row * src.row_stride_bytes;
  if constexpr (kMx) {
    const int j0 = static_cast<int>(col % 32);
    const uint8_t* b = rp + col / 32 * 17 + 1 + (j0 & 15);
    uint32_t in = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) in |= uint32_t{j0 < 16 ? b[i] & 15u : b[i] >> 4u} << (4 * i);
    return in;
  } else {
    const uint8_t* b = rp + col / 2;
    return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
  }
}

// The repacked scale byte of the 16 columns from col16: NVFP4's e4m3 without its sign; MXFP4's
// 32-column block's e8m0 exponent s as s + 118 (the header: MoeWork::stream_mx).
template <bool kMx>
__device__ __forceinline__ uint32_t StoredScale(const WeightRef& src, int64_t row, int64_t col16) {
  if constexpr (kMx) return uint32_t{src.data[row * src.row_stride_bytes + col16 / 32 * 17]} + 118u;
  return src.scale[row * src.scale_row_stride + col16 / 16] & 0x7Fu;
}

// One thread a repacked word (and a lane's scale word); kMx: from MXFP4's 17-byte blocks.
template <bool kMx>
__global__ void RepackKernel(WeightRef src, uint8_t* dst_data, uint8_t* dst_scale) {
  constexpr int kWordsPerChunk = SliceData<false>() / 4, kWordsPerQuad = 128;
  const int64_t chunks = src.cols / kKc;
  const int64_t words = src.rows * src.cols / 8;
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < words; o += int64_t{gridDim.x} * blockDim.x) {
    const int64_t chunk = o / kWordsPerChunk;
    const int within = static_cast<int>(o % kWordsPerChunk);
    const int q = within / kWordsPerQuad, lane = (within / 4) % 32, wi = within % 4;
    const int j = wi >> 1, h = wi & 1, g = lane >> 2, c = lane & 3;
    const int64_t s = chunk / chunks, kc = chunk % chunks;
    const int64_t row = 16 * s + g + 8 * h, col = src.col_offset + kc * kKc + q * 64 + 16 * c + 8 * j;
    const uint32_t in = StoredCodes<kMx>(src, row, col);
    uint32_t out = 0;
#pragma unroll
    for (int bit = 0; bit < 32; ++bit) out |= ((in >> kRepackBit[bit]) & 1u) << bit;
    reinterpret_cast<uint32_t*>(dst_data)[o] = out;
    if (wi == 0 && (q & 1) == 0) {  // the lane's scale bytes of quads q, q + 1
      uint32_t sc = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int qq = q + (i >> 1), hh = i & 1;
        const int64_t r = 16 * s + g + 8 * hh, col16 = src.col_offset + kc * kKc + qq * 64 + 16 * c;
        sc |= StoredScale<kMx>(src, r, col16) << (8 * i);
      }
      reinterpret_cast<uint32_t*>(dst_scale)[(chunk * 32 + lane) * (kQuads / 2) + q / 2] = sc;
    }
  }
}

// Sets *bad when a block scale of the view lies outside [3, 136] (the MXFP4 repack's exact range).
__global__ void MxScaleRangeKernel(WeightRef src, int* bad) {
  const int64_t per_row = src.cols / 32, n = src.rows * per_row;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / per_row, b = i % per_row;
    const uint32_t e = src.data[r * src.row_stride_bytes + (src.col_offset / 32 + b) * 17];
    if (e < 3 || e > 136) atomicOr(bad, 1);
  }
}

}  // namespace

bool MoeRepackMxfp4Eligible(const WeightRef& w) {
  return w.format == WeightFormat::kMXFP4 && w.rows > 0 && w.rows % 16 == 0 && w.cols > 0 && w.cols % kKc == 0 &&
         w.col_offset % 32 == 0 && w.data;
}

cudaError_t LaunchMoeMxfp4ScaleCheck(const WeightRef& src, int* bad, cudaStream_t stream) {
  const int64_t n = src.rows * (src.cols / 32);
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 1024));
  MxScaleRangeKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(src, bad);
  return cudaGetLastError();
}

cudaError_t LaunchMoeRepackMxfp4(const WeightRef& src, void* dst_data, void* dst_scale, cudaStream_t stream) {
  const int64_t words = src.rows * src.cols / 8;
  const int64_t blocks = std::min<int64_t>((words + 255) / 256, 4096);
  RepackKernel<true><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(src, static_cast<uint8_t*>(dst_data),
                                                                        static_cast<uint8_t*>(dst_scale));
  return cudaGetLastError();
}

bool MoeRepackNvfp4Eligible(const WeightRef& w) {
  return w.format == WeightFormat::kNVFP4 && w.rows > 0 && w.rows % 16 == 0 && w.cols > 0 && w.cols % kKc == 0 &&
         w.col_offset % 16 == 0 && w.data && w.scale;
}

cudaError_t LaunchMoeRepackNvfp4(const WeightRef& src, void* dst_data, void* dst_scale, cudaStream_t stream) {
  const int64_t words = src.rows * src.cols / 8;
  const int64_t blocks = std::min<int64_t>((words + 255) / 256, 4096);
  RepackKernel<false><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(src, static_cast<uint8_t*>(dst_data),
                                                                         static_cast<uint8_t*>(dst_scale));
  return cudaGetLastError();
}

cudaError_t LaunchMoeStreamGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return w.stream_q8 ? LaunchMoeStreamQ8GateUp(p, w, stream) : moe_stream::LaunchStreamGateUp<false>(p, w, stream);
}

cudaError_t LaunchMoeStreamDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream) {
  return w.stream_q8 ? LaunchMoeStreamQ8Down(p, w, stream) : moe_stream::LaunchStreamDown<false>(p, w, stream);
}

}  // namespace moeshard::gpu
