// The device-to-device copy rate the benchmarks measure their figures against ("copy bandwidth"
// in docs/PERFORMANCE.md): GB/s of read + write bytes, the median of five copies of a 2 GiB buffer.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "bench/cuda_exit.h"

namespace moeshard::bench {

inline double CopyRate() {
  const size_t n = size_t{1} << 31;
  void *a = nullptr, *b = nullptr;
  CK(cudaMalloc(&a, n));
  CK(cudaMalloc(&b, n));
  CK(cudaMemset(a, 1, n));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 6; ++i) {
    CK(cudaEventRecord(e0));
    CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float t = 0;
    CK(cudaEventElapsedTime(&t, e0, e1));
    if (i > 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(a));
  CK(cudaFree(b));
  return 2.0 * n / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

}  // namespace moeshard::bench
