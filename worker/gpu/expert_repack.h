// Load-time repack of a layer's NVFP4 experts for the streaming expert kernels
// (kernels/moe/moe_nvfp4_stream.cu, MoeRepackNvfp4): their layout lets the step stream the
// weights through shared memory and decode them with fewer instructions. The repacked views
// are readable by those kernels only, so the repack happens only where the step will use
// them: bf16 activations and every expert of the layer NVFP4 with sizes the kernels take.
// MOESHARD_MOE_REPACK=0 keeps the stored layout (the previous kernels), for comparisons.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/gpu_params.h"
#include "kernels/moe/moe_params.h"
#include "worker/gpu/device_memory.h"

namespace moeshard::gpu {

// Whether a layer of `format` experts of these sizes can be repacked at all (bf16 steps,
// NVFP4, width and intermediate multiples of 256, MOESHARD_MOE_REPACK not 0): read from the
// sizes alone, before any upload, so that other layers are uploaded once.
bool MayNvfp4Repack(WeightFormat format, int64_t width, int64_t inter, ActDType act);

// True when RepackNvfp4Experts would repack these (uploaded) experts.
bool WantNvfp4Repack(const std::vector<MoeExpertWeights>& ex, int64_t width, int64_t inter, ActDType act);

// Replaces every view of `ex` (device memory, e.g. in a temporary pool) by its repacked copy
// allocated from `pool`, enqueued on `stream`: the sources must stay alive until the stream
// has run it. Call only when WantNvfp4Repack; the caller then sets kMoeNvfp4Repacked in the
// layer's expert formats.
absl::Status RepackNvfp4Experts(std::vector<MoeExpertWeights>& ex, DevicePool& pool, GpuStream stream);

}  // namespace moeshard::gpu
