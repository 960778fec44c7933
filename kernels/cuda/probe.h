// A timeline of the decode chain (a build with -DMOESHARD_PROBE=ON only): every kernel's
// PdlWait (pdl.cuh) records, for thread 0 of each block, the global timer when the block
// reached the wait and when the wait returned, with the grid's launch number and shape. The
// wait returns once the kernel before has completed, so the release times of consecutive
// kernels are each kernel's share of the chain: what a kernel timed alone (ncu) does not show,
// and what PDL's overlap hides from a repeated-op measurement. `moeshard bench-model` prints the
// table (ProbeTimeline) after each stream count's decode when the build has the probe.
//
// Kernels may also mark points of their own (MOESHARD_PROBE_MARK(k), k < kProbeMarks, only after
// the block's PdlWait:
// e.g. the first weights arrived); the table adds each mark's mean time after the release.
//
// Each probed translation unit (every .cu that includes pdl.cuh) registers a setter for its own
// copy of the buffer pointer (a __device__ variable is per unit without relocatable device
// code); ProbeArm points them all at one buffer.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moeshard::gpu {

inline constexpr int kProbeMarks = 6;

struct ProbeRecord {
  uint64_t grid;     // %gridid: the launch's number
  uint64_t t_start;  // %globaltimer (ns) when the block's thread 0 reached PdlWait
  uint64_t t_wait;   // ... when the wait returned
  uint32_t grid_x;
  uint16_t grid_y, grid_z;
  uint32_t threads;  // per block
  uint32_t block;    // linear block index
  uint64_t marks[kProbeMarks];  // ProbeMark(k)'s time (ns), 0 when the block did not reach it
};

// The device buffer: a header, then `capacity` records.
struct ProbeHeader {
  uint32_t count;
  uint32_t capacity;
  uint64_t pad;
};

using ProbeSetter = cudaError_t (*)(void* buffer);

// Called at static initialization by each probed unit (probe.cuh); returns true.
bool RegisterProbeUnit(ProbeSetter set);
// Whether any unit registered (the build has MOESHARD_PROBE).
bool ProbeCompiledIn();
// Allocates a buffer of `capacity` records (once; a larger capacity reallocates), points every
// unit at it and zeroes the count. Synchronizes the device.
absl::Status ProbeArm(uint32_t capacity);
// Every unit's pointer back to null (kernels record nothing).
absl::Status ProbeDisarm();
// The records since ProbeArm (at most `capacity`; `dropped` gets how many did not fit).
absl::StatusOr<std::vector<ProbeRecord>> ProbeCollect(uint32_t* dropped);
// The chain table of one step's records: each launch in release order, grouped by shape.
std::string ProbeTimeline(const std::vector<ProbeRecord>& records);

}  // namespace moeshard::gpu
