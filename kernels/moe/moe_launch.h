// Internal to kernels/moe: the workspace layout and the kernel launchers that moe_expert.cc
// calls after validating the params. Each launcher returns the launch error.
//
// Grouped rows. Every (token, slot) pair whose expert is local becomes one "row"; rows are
// grouped by expert (expert 0's first), and within an expert ordered by pair index
// t * top_k + k. Row r of expert e lies in [offsets[e], offsets[e+1]).
#pragma once

#include <cuda_runtime.h>

#include "kernels/moe/moe_params.h"

namespace moeshard::gpu {

// Tokens per tile of the tensor-core path (its N dimension).
constexpr int kMoeTileTokens = 32;  // 4 n8 tiles: more would spill registers
// Tokens per task of the GEMV/mma path (moe_gemv.cu).
constexpr int kMoeGemvTokens = 32;
// The most (token, slot) pairs of a direct decode step (MoeWork::direct).
constexpr int64_t kMoeDirectMaxPairs = kMoePairOrderMaxPairs;  // gpu_params.h

// Stream-K fix-up of the streaming NVFP4 kernels (moe_nvfp4_stream.cu): at most this many
// blocks per launch, each with two slots of partial sums (its first and its last piece).
constexpr int kMoeFixBlocks = 512;
constexpr int kMoeFixSlotFloats = 8 * 32 * 32;  // 8 warps × 32 lanes × 32 accumulators

// Values of MoeWork::fast[e]: which path computes expert e. kMoePathSw: a repacked expert that the
// route gave to the wgmma GEMMs over decoded registers by its own row count (MoeWork::stream_split).
enum MoePath : uint8_t { kMoePathGeneric = 0, kMoePathNvfp4 = 1, kMoePathGemv = 2, kMoePathSw = 3 };

struct MoeWork {
  int64_t capacity = 0;          // rows the buffers hold: T * top_k
  int32_t* offsets = nullptr;    // [E + 1]
  int32_t* tile_base = nullptr;  // [E + 1]: Σ over earlier experts of ceil(count / kMoeTileTokens)
  int32_t* gemv_base = nullptr;  // [E + 1]: Σ over earlier GEMV-path experts of ceil(count / kMoeGemvTokens)
  uint8_t* fast = nullptr;       // [E]: MoePath of each expert (0: generic)
  int32_t* rows = nullptr;       // [capacity]: the pair index of each grouped row
  int32_t* pos = nullptr;        // [T * top_k]: the grouped row of each pair, or -1
  uint16_t* xg = nullptr;        // [capacity, L] bf16: x of each row, k-permuted (fast path)
  void* h = nullptr;             // [capacity, I]: silu(gate)·up, fp32 or bf16
  float* y = nullptr;            // [capacity, L]: each row's down output, fp32
  uint32_t* fix_count = nullptr;  // [kMoeFixBlocks]: arrivals per split item, zeroed by the route
  float* fix_part = nullptr;      // [kMoeFixBlocks, 2, kMoeFixSlotFloats]: partial sums
  bool fast_allowed = false;     // bf16 activations and sizes the NVFP4 fast path takes
  bool gemv_allowed = false;     // bf16 activations and sizes the GEMV/mma path takes
  // Decode-sized step (≤ kMoeDirectMaxPairs pairs) whose experts all take the GEMV/mma path:
  // no route stage; the GEMV kernels take one pair per task (moe_gemv.cu GemvDirectKernel) and
  // write pos; offsets, rows and the bases are not written.
  bool direct = false;
  // With direct, when every expert is Q8_0 or MXFP4 (MOESHARD_MOE_DIRECT_V2=0 off): the direct
  // GEMV of moe_direct.cu instead of moe_gemv.cu's (same sums, fewer instructions).
  bool direct_v2 = false;
  // The repacked streaming kernels read MXFP4 scale bytes (kMoeMxfp4Repacked), not e4m3.
  bool stream_mx = false;
  // The repacked streaming kernels read Q8_0's layout (kMoeQ8Repacked: moe_q8_stream.cu).
  bool stream_q8 = false;
  // With direct: the experts are repacked (any layout) and moe_stream_direct.cu's GEMV reads them
  // in place of the route and the streaming kernels (moe_expert.cc StreamDirectShape says at which
  // sizes; MOESHARD_MOE_STREAM_DIRECT=0 turns it off).
  bool stream_direct = false;
  // Prefill-sized steps on Hopper (moe_wgmma.cu): the GEMV/mma path's experts through bf16
  // weights expanded into wexp and warpgroup-MMA GEMMs instead of moe_gemv.cu.
  bool wgmma = false;
  // With wgmma: the experts are MXFP4 or Q8_0 repacked for the streaming kernels (stream_mx /
  // stream_q8); the route gives them the GEMV path's number and the expansion pass reads the
  // streaming layouts (moe_stream_decode.h RepackedRowBlock) into the same bf16 tiles.
  bool wgmma_repacked = false;
  // Prefill sizes of repacked NVFP4 / MXFP4 experts on Hopper (moe_stream_wgmma.cu): wgmma with
  // the weights decoded into registers, a 128-token tile a decode, in place of the streaming kernels.
  bool stream_wgmma = false;
  // Below the sizes that send every expert there (moe_stream_decode.h PlanStreamWgmma): the route
  // marks each repacked expert with at least sw_min_rows rows kMoePathSw (no streaming tiles); the
  // streaming kernels take the rest and the wgmma GEMMs those, in the same step.
  bool stream_split = false;
  // With stream_wgmma, by the host's rule (moe_expert.cc StreamWgmmaPairFor): the two-CTA kernel of 32-token
  // items takes the experts with at most 32 rows, the 128-token kernel those the route marked
  // kMoePathSw (sw_min_rows = 33), the second launched taking the SMs the first leaves (it waits for
  // it only before exiting: moe_stream_wgmma.cu SwArgs::defer).
  bool sw_pair = false;
  // The pair step's order (the 128-token kernel first: MOESHARD_MOE_SW_PAIR 2 or 4) and whether the
  // two-CTA kernel draws its items from sw_next (MOESHARD_MOE_SW_DYN; both set by StreamWgmmaPairFor).
  bool sw_big_first = true, sw_dyn = true;
  // Two item counters (gate/up, down) for the pair step's two-CTA kernel (MOESHARD_MOE_SW_DYN=1, the
  // default), zeroed by the route each step, or before a GEMM stage run without the route
  // (MoeExpertStepStages: moe_expert_bench --stages; its stage times then include the memset).
  int32_t* sw_next = nullptr;
  int32_t sw_min_rows = 0;   // with stream_split or sw_pair; 0 otherwise
  // With stream_direct, one token and every expert local (MoeExpertStepResidual): down updates the
  // residual stream itself, res_s = (res_s + res_pre) + the mix (moe_stream_direct_res.cu); no combine.
  float* res_s = nullptr;
  const float* res_pre = nullptr;  // optional
  uint16_t* wexp = nullptr;  // [E][2I][L] gate/up interleaved, then [E][L][I] down (bf16)
  int num_sms = 0;
};

cudaError_t LaunchMoeRoute(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeGatherX(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeGenericGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeGenericDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeFastGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeFastDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeGemvGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeGemvDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeDirect(bool gate_up, const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
// The streaming kernels (moe_stream.cuh; moe_nvfp4_stream.cu) over repacked weights, and the repack.
cudaError_t LaunchMoeStreamGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeStreamDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
bool MoeRepackNvfp4Eligible(const WeightRef& w);
cudaError_t LaunchMoeRepackNvfp4(const WeightRef& src, void* dst_data, void* dst_scale, cudaStream_t stream);
bool MoeRepackMxfp4Eligible(const WeightRef& w);
cudaError_t LaunchMoeMxfp4ScaleCheck(const WeightRef& src, int* bad, cudaStream_t stream);
cudaError_t LaunchMoeRepackMxfp4(const WeightRef& src, void* dst_data, void* dst_scale, cudaStream_t stream);
// The same kernels over Q8_0's int8 layout (moe_q8_stream.cu), and its repack.
cudaError_t LaunchMoeStreamQ8GateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeStreamQ8Down(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
bool MoeRepackQ8Eligible(const WeightRef& w);
cudaError_t LaunchMoeRepackQ8(const WeightRef& src, void* dst_data, void* dst_scale, cudaStream_t stream);
cudaError_t LaunchMoeStreamDirectGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeStreamDirectDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
// Down with the residual update inside (moe_stream_direct_res.cu), and the steps it takes: one
// token, at most 8 slots, every expert on this GPU, no output norm, L % 16 == 0.
bool MoeDownResidualShape(const MoeExpertParams& p);
cudaError_t LaunchMoeStreamDirectDownResidual(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
// Their warp form (moe_stream_direct_warp.cu; moe_env.h StreamDirectWarpForm says when).
cudaError_t LaunchMoeStreamDirectWarp(bool gate_up, const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
// The wgmma path (moe_wgmma.cu): whether this build and GPU run it (sm_90a), and its launches in
// place of LaunchMoeGemvGateUp / LaunchMoeGemvDown.
constexpr int kMoeWgmmaMaxExperts = 4096;
bool MoeWgmmaSupported();
cudaError_t LaunchMoeWgmmaGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeWgmmaDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
// The wgmma GEMMs over repacked e2m1 experts (moe_stream_wgmma.cu): whether this build, GPU and
// shape run them, and their launches (the gate/up one gathers x into xg first).
bool MoeStreamWgmmaSupported(int E, int64_t L, int64_t I, int64_t capacity);
cudaError_t LaunchMoeStreamWgmmaGateUp(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeStreamWgmmaDown(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);
cudaError_t LaunchMoeCombine(const MoeExpertParams& p, const MoeWork& w, cudaStream_t stream);

// Benchmarks only: MoeExpertStep (params already valid) restricted to the stages in `mask`,
// bit i = kMoeStage*: each stage alone, or all but one, shows where the time goes.
enum MoeStage : unsigned {
  kMoeStageRoute = 1,
  kMoeStageGather = 2,
  kMoeStageFastGateUp = 4,
  kMoeStageGenericGateUp = 8,
  kMoeStageFastDown = 16,
  kMoeStageGenericDown = 32,
  kMoeStageCombine = 64,
  kMoeStageGemvGateUp = 128,
  kMoeStageGemvDown = 256,
  kMoeStageAll = 511,
};
cudaError_t MoeExpertStepStages(const MoeExpertParams& p, unsigned mask, cudaStream_t stream);
// The same with the residual update inside down (MoeExpertStepResidual; res_s null: as above). Where
// the step cannot take it (MoeDownResidualShape, the direct GEMV over repacked experts, the switch),
// nothing is launched and *res_taken is false.
cudaError_t MoeExpertStepStagesRes(const MoeExpertParams& p, unsigned mask, float* res_s, const float* res_pre,
                                   bool* res_taken, cudaStream_t stream);

}  // namespace moeshard::gpu
