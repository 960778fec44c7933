// Plain parameter structs of the CUDA kernels: device pointers, strides and sizes only.
// Free of CUDA and Abseil headers so that .cu files, host code and tests all include it.
#pragma once

#include <cstdint>

#include "kernels/cpu/weight_ref.h"

struct CUstream_st;  // what cudaStream_t points to

namespace moeshard::gpu {

using GpuStream = CUstream_st*;  // nullptr: the legacy default stream

enum class ActDType : uint8_t { kF32, kBF16 };

// Expands every row of `w` (a WeightRef whose `data` and `scale` point to device memory)
// into out[rows, out_row_stride] as float32 or bf16 (round to nearest even of the fp32 value).
struct ExpandParams {
  WeightRef w;
  void* out = nullptr;
  int64_t out_row_stride = 0;  // elements; 0 means w.cols
  ActDType out_dtype = ActDType::kF32;
};

// y[T, w.rows] = x[T, w.cols] · Wᵀ (+ bias[w.rows]), fp32 accumulation. x and y share the
// activation dtype; `w` points to device memory in its stored format.
struct MatMulParams {
  WeightRef w;
  const void* x = nullptr;
  int64_t x_row_stride = 0;  // elements; 0 means w.cols
  void* y = nullptr;
  int64_t y_row_stride = 0;  // elements; 0 means w.rows
  int64_t num_tokens = 0;
  ActDType act_dtype = ActDType::kF32;
  const float* bias = nullptr;  // device, optional
};

}  // namespace moeshard::gpu
