// Small CUDA kernels for bench/moe_expert_bench.cc: random fills on the device and the
// cuBLAS baseline's glue (gather of token rows, SiLU gating). Free of CUDA headers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/gpu_params.h"

namespace moeshard::bench {

// Random bytes; with `e4m3_scale`, e4m3 codes of 0.5 … 0.9375 (block scales).
void FillRandomBytes(uint8_t* p, size_t n, uint64_t seed, bool e4m3_scale, gpu::GpuStream s);
// Makes random bytes a sane weight matrix of format f (contiguous rows of whole blocks):
// Q8_0 block scales d in [2^-12, 2^-11), MXFP4 scales 2^-7 or 2^-6, BF16 magnitudes in
// [2^-7, 2^-5); other formats are left alone.
void SaneWeights(uint8_t* p, size_t bytes, WeightFormat f, gpu::GpuStream s);
// bf16 values uniform in about [-2, 2].
void FillRandomBf16(uint16_t* p, size_t n, uint64_t seed, gpu::GpuStream s);
// xg[r] = x[rows[r] / top_k] for r < num_rows (bf16 rows of width L).
void GatherRows(const uint16_t* x, const int32_t* rows, int64_t num_rows, int top_k, int64_t L, uint16_t* xg,
                gpu::GpuStream s);
// h[r, i] = bf16(silu(gu[r, i]) · gu[r, I + i]) for bf16 gu [rows, 2I].
void SiluMul(const uint16_t* gu, int64_t num_rows, int64_t I, uint16_t* h, gpu::GpuStream s);

}  // namespace moeshard::bench
