// Shared by the GPU kernel tests (tests/kernels/*_test.cc): status assertions and the
// weight formats every kernel path is checked in.
#pragma once

#include "absl/status/status.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_check.h"

// Asserts that a CUDA call returned cudaSuccess (the error names the call).
#define CUDA_OK(expr)                                                          \
  do {                                                                         \
    absl::Status s_ = ::moeshard::gpu::CudaStatus((expr), #expr);              \
    ASSERT_TRUE(s_.ok()) << s_;                                                \
  } while (0)

// Asserts that an absl::Status is OK.
#define STATUS_OK(expr)         \
  do {                          \
    absl::Status s_ = (expr);   \
    ASSERT_TRUE(s_.ok()) << s_; \
  } while (0)

namespace moeshard::testing_gpu {

// Every stored weight format the kernels read.
inline constexpr WeightFormat kAllFormats[] = {WeightFormat::kF32,  WeightFormat::kBF16,  WeightFormat::kF16,
                                               WeightFormat::kQ8_0, WeightFormat::kMXFP4, WeightFormat::kNVFP4};

}  // namespace moeshard::testing_gpu
