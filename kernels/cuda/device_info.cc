#include "kernels/cuda/device_info.h"

#include <cuda_runtime.h>

#include <atomic>

namespace moeshard::gpu {

int DeviceSmCount() {
  static std::atomic<int> sm_count[64];  // per device, 0 until read
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    cudaGetLastError();
    return 0;
  }
  int n = sm_count[dev].load(std::memory_order_relaxed);
  if (n > 0) return n;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) {
    cudaGetLastError();
    return 0;
  }
  sm_count[dev].store(n, std::memory_order_relaxed);
  return n;
}

}  // namespace moeshard::gpu
