// Device side of the decode-chain probe (probe.h): compiled in only with -DMOESHARD_PROBE.
// PdlWait (pdl.cuh) calls ProbeReserve before the wait and ProbeRecordWait after it.
#pragma once

#if defined(MOESHARD_PROBE)
#include <cstdint>

#include "kernels/cuda/probe.h"

namespace moeshard::gpu {
namespace probe_unit {
static __device__ ProbeHeader* g_probe = nullptr;  // this unit's copy; ProbeArm sets it
static cudaError_t SetProbe(void* p) { return cudaMemcpyToSymbol(g_probe, &p, sizeof(p)); }
[[maybe_unused]] static const bool g_registered = RegisterProbeUnit(&SetProbe);
}  // namespace probe_unit

__device__ __forceinline__ uint64_t ProbeNow() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Thread 0's slot, taken before the wait (its atomic overlaps the wait; the probe's buffer is
// no kernel's data, so pdl.cuh's rule 1 is kept in spirit); null when not armed or full.
struct ProbeSlot {
  ProbeRecord* record;
  uint64_t t_start;
};

__device__ __forceinline__ ProbeSlot ProbeReserve() {
  ProbeSlot s{nullptr, ProbeNow()};
  if (threadIdx.x | threadIdx.y | threadIdx.z) return s;
  ProbeHeader* h = probe_unit::g_probe;
  if (h == nullptr) return s;
  const uint32_t i = atomicAdd(&h->count, 1u);
  if (i < h->capacity) s.record = reinterpret_cast<ProbeRecord*>(h + 1) + i;
  return s;
}

// The block's record (thread 0's slot) for ProbeMark; one per kernel (static shared memory).
__device__ __forceinline__ ProbeRecord*& ProbeBlockRecord() {
  __shared__ ProbeRecord* record;
  return record;
}

__device__ __forceinline__ void ProbeRecordWait(const ProbeSlot& s) {
  const uint64_t t_wait = ProbeNow();
  if (threadIdx.x | threadIdx.y | threadIdx.z) return;
  ProbeBlockRecord() = s.record;
  if (s.record == nullptr) return;
  ProbeRecord r;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(r.grid));
  r.t_start = s.t_start;
  r.t_wait = t_wait;
  r.grid_x = gridDim.x;
  r.grid_y = static_cast<uint16_t>(gridDim.y);
  r.grid_z = static_cast<uint16_t>(gridDim.z);
  r.threads = blockDim.x * blockDim.y * blockDim.z;
  r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  for (int k = 0; k < kProbeMarks; ++k) r.marks[k] = 0;
  *s.record = r;
}

// Thread 0 of a block that has passed PdlWait (before it the block's record is not set): the time
// of point k of its kernel.
__device__ __forceinline__ void ProbeMarkAt(int k) {
  if (threadIdx.x | threadIdx.y | threadIdx.z) return;
  ProbeRecord* r = ProbeBlockRecord();
  if (r != nullptr) r->marks[k] = ProbeNow();
}

}  // namespace moeshard::gpu
#define MOESHARD_PROBE_MARK(k) ::moeshard::gpu::ProbeMarkAt(k)
#else
#define MOESHARD_PROBE_MARK(k) ((void)0)
#endif  // MOESHARD_PROBE
