// Programmatic dependent launch (Hopper): a kernel launched with LaunchPdl may start while the
// kernel before it on the stream is still running; it does what does not depend on that kernel
// (its weights are read-only: their first loads can be in flight) and then PdlWait()s, which
// returns once every earlier kernel has completed and its writes are visible. So the launch
// latency and the first DRAM round trip of a decode step's ~12 kernels per layer overlap with
// the kernel before, inside one CUDA graph too (the graph keeps the programmatic edges).
//
// The contract for a kernel launched with LaunchPdl — every one of its threads:
//   1. before PdlWait() reads only memory no kernel of the step writes (weights, params), or
//      memory written by a kernel at least two launches back (the kernel just before waited for
//      it before it could let this one start: rule 3; read such memory through L2, ld.global.cg,
//      not a possibly stale L1 line), and writes nothing at all;
//   2. calls PdlWait() before anything else, including an early return (a block that exited
//      without waiting could let the grid complete before its predecessor, and the kernel after
//      it would then not wait for that predecessor);
//   3. calls PdlTrigger() after PdlWait(): the next kernel may then be scheduled; it waits in
//      turn, so kernels run at most one ahead.
// Kernels launched the ordinary way after one of these are ordinary stream order.
//
// MOESHARD_PDL=0 launches the same kernels the ordinary way (the waits return at once), for
// measuring both in one binary; so do GPUs older than Hopper.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/probe.cuh"

namespace moeshard::gpu {

__device__ __forceinline__ void PdlWait() {
#if defined(MOESHARD_PROBE)
  const ProbeSlot probe = ProbeReserve();
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if defined(MOESHARD_PROBE)
  ProbeRecordWait(probe);  // a -DMOESHARD_PROBE=ON build's timeline (probe.h)
#endif
}

__device__ __forceinline__ void PdlTrigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether the current device has compute capability 9.0 or more (Hopper: programmatic launch,
// thread-block clusters).
inline bool DeviceIsSm90OrNewer() {
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return major >= 9;
}

// Whether the current device has compute capability exactly 9.0 (the sm_90a code: wgmma, tensor
// maps), per device, read once each.
inline bool DeviceIsSm90() {
  static std::atomic<int> cc[64];  // 0 unread, else major * 10 + minor + 1
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    cudaGetLastError();
    return false;
  }
  int v = cc[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    v = major * 10 + minor + 1;
    cc[dev].store(v, std::memory_order_relaxed);
  }
  return v == 91;
}

// On when the process's GPU is a Hopper or newer (programmatic launch needs compute capability
// 9.0; older GPUs launch the ordinary way) and MOESHARD_PDL is not 0. Read once per process.
inline bool PdlEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_PDL");
    if (v && std::strcmp(v, "0") == 0) return false;
    return DeviceIsSm90OrNewer();
  }();
  return on;
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization allowed;
// returns the launch's error.
template <typename... Params, typename... Args>
cudaError_t LaunchPdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = PdlEnabled() ? 1 : 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

}  // namespace moeshard::gpu
