// Load-time repack of a layer's NVFP4, MXFP4 or Q8_0 experts for the streaming expert kernels
// (kernels/moe/moe_stream.cuh; MoeRepackNvfp4 / MoeRepackMxfp4 / MoeRepackQ8): their layout lets
// the step stream the weights through shared memory by large bulk copies and decode them with fewer
// instructions. The repacked views are readable by those kernels only, so the repack happens
// only where the step will use them: bf16 activations and every expert of the layer of one
// format with sizes the kernels take (MXFP4: every block scale in the exact range too).
// Which formats are repacked is the deployment's choice (RepackPolicy, from the runner's
// --expert-layout): NVFP4 by default; MXFP4 and Q8_0 with `stream`, where the streaming kernels
// and the direct GEMV over their layout decode 1-64 streams faster than the kernels over the
// stored blocks, but the stored blocks' wgmma GEMMs prefill 4,096 tokens faster (H200,
// docs/PERFORMANCE.md "The streaming layouts on by request, the direct GEMV by default").
// MOESHARD_MOE_REPACK=0 keeps every layer as stored whatever the policy (benchmarks' comparisons).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/gpu_params.h"
#include "kernels/moe/moe_params.h"
#include "worker/gpu/device_memory.h"

namespace moeshard::gpu {

// The formats a deployment repacks (worker/model_runner.h ExpertLayout).
struct RepackPolicy {
  bool nvfp4 = true;
  bool mxfp4 = false;
  bool q8 = false;  // Q8_0 into the int8 streaming layout (MoeRepackQ8)
};

// Whether a layer of `format` experts of these sizes can be repacked at all (bf16 steps, a
// format the policy repacks, width and intermediate multiples of 256): read from the
// sizes alone, before any upload, so that other layers are uploaded once.
bool MayRepackExperts(WeightFormat format, int64_t width, int64_t inter, ActDType act, RepackPolicy policy);
// Why MayRepackExperts is false, in words for the operator (empty when it is true).
std::string RepackRefusal(WeightFormat format, int64_t width, int64_t inter, ActDType act, RepackPolicy policy);

// True when RepackExperts would repack these (uploaded) experts. MXFP4 experts' scales are read
// on the device (synchronizes `stream`).
// When false and `why` is given, it says why in words.
absl::StatusOr<bool> WantRepackExperts(const std::vector<MoeExpertWeights>& ex, int64_t width, int64_t inter,
                                       ActDType act, RepackPolicy policy, GpuStream stream, std::string* why = nullptr);

// Replaces every view of `ex` (device memory, e.g. in a temporary pool) by its repacked copy
// allocated from `pool`, enqueued on `stream`: the sources must stay alive until the stream
// has run it. Call only when WantRepackExperts; returns the bits the caller adds to the
// layer's expert formats (kMoeNvfp4Repacked, and kMoeMxfp4Repacked for MXFP4 experts or
// kMoeQ8Repacked for Q8_0 ones).
absl::StatusOr<uint32_t> RepackExperts(std::vector<MoeExpertWeights>& ex, DevicePool& pool, GpuStream stream);

}  // namespace moeshard::gpu
