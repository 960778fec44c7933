// Shared-memory barriers (mbarrier, sm_90) for producer/consumer rings in the attention kernels
// and the MoE decode GEMV: init, arrive, the arrival of a thread's earlier cp.async copies, bulk
// copies counted in bytes, a parity wait, and warpgroup
// register reallocation (setmaxnreg) and named barriers for warp-specialized kernels.
#pragma once

#include <cstdint>

namespace moeshard::gpu {

__device__ __forceinline__ uint32_t SharedAddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void MbarrierInit(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(SharedAddr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarrierArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(SharedAddr(bar)) : "memory");
}
// One arrival on `bar` once every cp.async this thread issued before it has landed.
__device__ __forceinline__ void MbarrierArriveOnCpAsync(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(SharedAddr(bar)) : "memory");
}
// True in one lane of the (fully active) warp: elect.sync. What a branch on it holds runs in one
// thread that the compiler knows is alone, so warp-uniform copy operands stay in uniform registers
// — under `lane == 0` it loops over the active lanes around every copy (~120 cycles a bulk copy,
// measured in moe_stream_wgmma.cu's producer).
__device__ __forceinline__ bool ElectOne() {
  uint32_t elected = 0;
  asm volatile("{\n.reg .pred p;\nelect.sync _|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n" : "=r"(elected)::"memory");
  return elected != 0;
}
// One arrival on `bar` that also expects `bytes` more from copies counted on it (BulkCopyToShared).
__device__ __forceinline__ void MbarrierArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(SharedAddr(bar)), "r"(bytes) : "memory");
}
// `bytes` (a multiple of 16) from 16-byte aligned global `src` to 16-byte aligned shared `dst`
// by the copy engine (a 1-D bulk copy), its bytes counted on `bar`.
__device__ __forceinline__ void BulkCopyToShared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   SharedAddr(dst)),
               "l"(src), "r"(bytes), "r"(SharedAddr(bar))
               : "memory");
}
// A box of a 3-D tensor map (a __grid_constant__ kernel parameter, or global memory written
// before the launch) into shared memory (128-byte aligned; 1024 with the 128-byte swizzle),
// counted on `bar`; coordinates in elements, innermost first.
__device__ __forceinline__ void TensorCopy3dToShared(void* dst, const void* map, int x, int y, int z, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::
          "r"(SharedAddr(dst)),
      "l"(map), "r"(x), "r"(y), "r"(z), "r"(SharedAddr(bar))
      : "memory");
}
// A box of a 2-D tensor map into shared memory, as TensorCopy3dToShared.
__device__ __forceinline__ void TensorCopy2dToShared(void* dst, const void* map, int x, int y, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          SharedAddr(dst)),
      "l"(map), "r"(x), "r"(y), "r"(SharedAddr(bar))
      : "memory");
}
// Makes this thread's mbarrier inits visible to the copy engine (before a CTA barrier).
__device__ __forceinline__ void FenceMbarrierInit() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Waits until the phase of parity `parity` has completed (a fresh barrier counts parity 1 as
// completed, so a ring's producer passes its first wait on each empty slot).
__device__ __forceinline__ void MbarrierWait(uint64_t* bar, uint32_t parity) {
  const uint32_t a = SharedAddr(bar);
  uint32_t ok = 0;
  do {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(ok)
                 : "r"(a), "r"(parity)
                 : "memory");
  } while (!ok);
}

// Warpgroup-wide register budget changes (every thread of the warpgroup executes them).
template <int N>
__device__ __forceinline__ void RegsDecrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void RegsIncrease() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}
// Barrier `id` (1..15; 0 is __syncthreads) among `threads` threads (a multiple of 32): wait for
// all of them, or only count this thread's arrival.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace moeshard::gpu
