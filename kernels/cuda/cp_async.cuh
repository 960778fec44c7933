// Asynchronous global -> shared copies (cp.async, sm_80+) for the attention kernels: a 16-byte
// copy bypassing L1 (zero-filled when `valid` is false), a 4-byte one, and the group fences.
#pragma once

#include <cstdint>

namespace moeshard::gpu {

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void CpCommit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

}  // namespace moeshard::gpu
