// Dense projections of 9 to 64 tokens for split Q8 weights and bf16 activations on the tensor
// cores: each weight is decoded once (int8 -> bf16, exact) and serves every token of the launch,
// where the 8-token kernel (gemv_mma.cu) run in chunks reads and decodes the weights once a
// chunk, and cuBLAS on an expanded bf16 copy writes and reads 2 bytes a weight besides.
//
// A block of 8 warps takes 128 rows of one matrix (16 a warp) over a range of K; the S blocks
// of a thread-block cluster (S = 1, 2, 4 or 8: the most whose grid fits one wave, PickSplit)
// split K and meet in distributed shared memory, each block summing an S-th of the tile's
// outputs over the S partials in rank order (deterministic). Every k-chunk of 64 columns of the
// block's weight rows, their f16 scales and the tokens' activations goes through a ring of
// shared-memory stages filled with cp.async by all threads (the weights of the first stages
// before the kernel's PDL wait). Lane (g, c) =
// (lane / 4, lane % 4) decodes codes 8c..8c+7 of rows g and g + 8 of its warp's 16 in each
// 32-column block: its A-fragment share of the block's two m16n8k16 k-steps, in the permuted k
// order of gemv_mma.cu (the activations are read in the same order, so the dot products are
// unchanged); B is token (8n + g)'s same 8 activations, one 16-byte shared load a token tile.
// Each block's two mma go into a zeroed accumulator that the rows' f16 scales multiply into
// the sums (fp32): the only rounding beyond fp32 accumulation is the activations' own bf16.
//
// Shared-memory rows are padded so that both fragment loads are conflict-free: weight rows of
// 96 bytes (a half-warp's 8-byte loads of rows g..g+3 cover the 32 banks once), token rows of
// 192 bytes (a quarter-warp's 16-byte loads of tokens g, g+1 likewise).
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/device_info.h"
#include "kernels/cuda/gemv_launch.h"
#include "kernels/cuda/gemv_store.cuh"
#include "kernels/cuda/mma_bf16.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/weight_decode.cuh"

namespace moeshard::gpu {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileRows = 16 * kWarps;  // 128
constexpr int kChunk = 64;              // columns a stage: two 32-column blocks
constexpr int kStages = 4;
constexpr int kWRow = kChunk + 32;      // 96 bytes a weight row
constexpr int kXRow = 2 * kChunk + 64;  // 192 bytes a token row
constexpr int kSRow = kChunk / 32 * 2;  // 4 bytes of f16 scales a row
constexpr int kMaxCluster = 8;

template <int NT>
struct Geo {
  static constexpr int kW = kTileRows * kWRow;  // 12,288
  static constexpr int kS = kTileRows * kSRow;  // 512
  static constexpr int kX = 8 * NT * kXRow;     // 1,536 a token tile
  static constexpr int kStage = kW + kS + kX;
  static constexpr int kRed = kWarps * NT * 4 * 32 * 4;  // a block's partial sums
  static constexpr int kSmem = kStages * kStage > kRed ? kStages* kStage : kRed;
};

struct Tiles {
  int64_t begin[4] = {};  // 128-row tiles: matrix i owns [begin[i], begin[i + 1])
};

__device__ __forceinline__ void CpAsync16(uint32_t s, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(g));
}
__device__ __forceinline__ void CpAsync4(uint32_t s, const void* g) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(g));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Cluster barriers: the first makes every block's partials visible to the others (release /
// acquire); the last only keeps each block resident until the others have read them (their
// loads completed before their values were added).
__device__ __forceinline__ void ClusterSyncRelease() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ void ClusterSyncRelaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
}

// Rank `rank`'s share of the split-K sums (see the kernel's end): S loads of 16 bytes a thread
// from the S blocks' shared memory (mapa + ld.shared::cluster), then the sums in rank order.
template <int NT, int S, typename Store>
__device__ __forceinline__ void ReduceSplits(const float* red, int rank, const Store& store) {
  constexpr int kPerRank = kWarps * NT * 4 * 32 / S;
  const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(red));
  uint32_t base[S];
#pragma unroll
  for (int r = 0; r < S; ++r) asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(base[r]) : "r"(local), "r"(r));
  for (int f = rank * kPerRank + 4 * static_cast<int>(threadIdx.x); f < (rank + 1) * kPerRank; f += 4 * kThreads) {
    float4 v[S];
#pragma unroll
    for (int r = 0; r < S; ++r) {
      asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                   : "=f"(v[r].x), "=f"(v[r].y), "=f"(v[r].z), "=f"(v[r].w)
                   : "r"(base[r] + 4 * f));
    }
    float4 sum = v[0];
#pragma unroll
    for (int r = 1; r < S; ++r) sum.x += v[r].x, sum.y += v[r].y, sum.z += v[r].z, sum.w += v[r].w;
    const float out[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int fi = f + i, ln = fi % 32, q = fi / 32 % 4, n = fi / 128 % NT, w = fi / (128 * NT);
      store(w, n, q, out[i], ln);
    }
  }
}

template <int NT>
__global__ void __launch_bounds__(kThreads, 2) GemvQ8WideKernel(GemvLaunch a, Tiles tl, int S) {
  using G = Geo<NT>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, c = lane % 4;
  const int64_t cols = a.cols;
  const int nt_tok = a.num_tokens;
  const int rank = static_cast<int>(blockIdx.x % S);
  const int64_t tile = blockIdx.x / S;
  int mi = 0;
  while (mi + 1 < a.num_matrices && tile >= tl.begin[mi + 1]) ++mi;
  const GemvMatrix m = mi == 0 ? a.m[0] : mi == 1 ? a.m[1] : a.m[2];  // selects: no local copy of a.m
  const int64_t r0 = (tile - tl.begin[mi]) * kTileRows;
  const int64_t nb = cols / 32;
  const int nchunk_all = static_cast<int>(cols / kChunk);
  const int ch_begin = rank * nchunk_all / S, ch_end = (rank + 1) * nchunk_all / S;
  const int nchunks = ch_end - ch_begin;
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  // Stage-filling: weights (2 copies of 16 bytes a thread), scales (threads 0..127, 4 bytes), x.
  auto stage_w = [&](int s, int ch) {
    const uint32_t slot = sbase + s * G::kStage;
    const int64_t col0 = static_cast<int64_t>(ch) * kChunk;
#pragma unroll
    for (int i = tid; i < kTileRows * 4; i += kThreads) {
      const int rr = i / 4, q = i % 4;
      const int64_t row = min(r0 + rr, m.rows - 1);  // missing rows re-read, stored nowhere
      CpAsync16(slot + rr * kWRow + 16 * q, static_cast<const int8_t*>(m.w) + row * cols + col0 + 16 * q);
    }
    if (tid < kTileRows) {
      const int64_t row = min(r0 + tid, m.rows - 1);
      CpAsync4(slot + G::kW + tid * kSRow, m.scales + row * nb + col0 / 32);
    }
  };
  auto stage_x = [&](int s, int ch) {
    const uint32_t slot = sbase + s * G::kStage + G::kW + G::kS;
    const int64_t col0 = static_cast<int64_t>(ch) * kChunk;
    for (int i = tid; i < nt_tok * 8; i += kThreads) {
      const int t = i / 8, q = i % 8;
      CpAsync16(slot + t * kXRow + 16 * q, static_cast<const uint16_t*>(a.x) + t * a.x_stride + col0 + 8 * q);
    }
  };

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nchunks) stage_w(s, ch_begin + s);
  }
  PdlWait();
  PdlTrigger();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nchunks) stage_x(s, ch_begin + s);
    CpAsyncCommit();  // group s: chunk s's x (and, in group 0, every weight copy before the wait)
  }

  float acc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int q = 0; q < 4; ++q) acc[n][q] = 0.f;

  const int wr = 16 * warp + g;  // this lane's first row in the tile
#pragma unroll 1
  for (int ci = 0; ci < nchunks; ++ci) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // chunk ci is in; every warp is done with chunk ci - 1, whose slot refills now
    {
      const int nx = ci + kStages - 1;
      if (nx < nchunks) {
        stage_w(nx % kStages, ch_begin + nx);
        stage_x(nx % kStages, ch_begin + nx);
      }
      CpAsyncCommit();
    }
    const uint8_t* slot = smem + (ci % kStages) * G::kStage;
    const uint8_t* w0 = slot + wr * kWRow + 8 * c;
    const uint8_t* w1 = w0 + 8 * kWRow;
    const uint16_t* sc = reinterpret_cast<const uint16_t*>(slot + G::kW);
    const uint8_t* xs = slot + G::kW + G::kS + g * kXRow + 16 * c;
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
      const uint2 q0 = *reinterpret_cast<const uint2*>(w0 + 32 * kb);
      const uint2 q1 = *reinterpret_cast<const uint2*>(w1 + 32 * kb);
      uint32_t lo[2][2], hi[2][2];  // [row g / g + 8][k-step]
      I8x4ToBf16(q0.x, lo[0][0], hi[0][0]);
      I8x4ToBf16(q0.y, lo[0][1], hi[0][1]);
      I8x4ToBf16(q1.x, lo[1][0], hi[1][0]);
      I8x4ToBf16(q1.y, lo[1][1], hi[1][1]);
      const float s0 = __half2float(__ushort_as_half(sc[wr * 2 + kb]));
      const float s1 = __half2float(__ushort_as_half(sc[(wr + 8) * 2 + kb]));
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const uint4 b = *reinterpret_cast<const uint4*>(xs + n * 8 * kXRow + 64 * kb);
        float t[4];
        MmaBf16Zero(t, lo[0][0], lo[1][0], hi[0][0], hi[1][0], b.x, b.y);
        MmaBf16(t, lo[0][1], lo[1][1], hi[0][1], hi[1][1], b.z, b.w);
        acc[n][0] = fmaf(s0, t[0], acc[n][0]);
        acc[n][1] = fmaf(s0, t[1], acc[n][1]);
        acc[n][2] = fmaf(s1, t[2], acc[n][2]);
        acc[n][3] = fmaf(s1, t[3], acc[n][3]);
      }
    }
  }
  CpAsyncWait<0>();

  auto store = [&](int w, int n, int q, float s, int ln) {
    const int64_t row = r0 + 16 * w + ln / 4 + (q & 2 ? 8 : 0);
    const int tok = 8 * n + 2 * (ln % 4) + (q & 1);
    if (row < m.rows && tok < nt_tok) GemvStoreY(m, a.y_f32, row, tok, s);
  };
  if (S == 1) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int q = 0; q < 4; ++q) store(warp, n, q, acc[n][q], lane);
    return;
  }
  // Split K over the cluster: each block's partials at red[f], f = ((warp * NT + n) * 4 + q) * 32 +
  // lane; rank r finishes the r-th S-th of the f, four consecutive ones a thread, each sum over
  // the ranks in rank order with every rank's load issued before the first add (a load of
  // distributed shared memory is a round trip: summing load by load, the first version spent
  // ~40 % of its time at 64 tokens here).
  __syncthreads();  // every warp is done with the ring, which red overlays
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int q = 0; q < 4; ++q) red[((warp * NT + n) * 4 + q) * 32 + lane] = acc[n][q];
  ClusterSyncRelease();
  switch (S) {
    case 2:
      ReduceSplits<NT, 2>(red, rank, store);
      break;
    case 4:
      ReduceSplits<NT, 4>(red, rank, store);
      break;
    default:
      ReduceSplits<NT, 8>(red, rank, store);
      break;
  }
  ClusterSyncRelaxed();  // no block leaves while another may still read its partials
}

// Cluster size S (1, 2, 4 or 8; 1 on GPUs without clusters): the most K-splits whose grid still
// fits one wave of resident blocks (`per_sm` a multiprocessor), each split keeping at least two
// chunks. More splits than a wave holds leave a second, mostly empty wave (the Q/K/V projection
// at 64 tokens: 320 blocks where 264 are resident). MOESHARD_GEMV_WIDE_WAVE=0: the first rule
// instead (the fewest splits that give two blocks a multiprocessor), for measuring.
int PickSplit(int64_t tiles, int64_t cols, int per_sm) {
  static const int sms = [] {
    const int n = DeviceSmCount();
    return n > 0 ? n : 132;
  }();
  static const bool clusters = DeviceIsSm90OrNewer();
  static const bool wave = [] {
    const char* v = std::getenv("MOESHARD_GEMV_WIDE_WAVE");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  if (!clusters) return 1;
  int S = 1;
  if (!wave) {
    while (S < kMaxCluster && tiles * S < 2 * sms && cols / kChunk / (2 * S) >= 2) S *= 2;
    return S;
  }
  const int64_t capacity = static_cast<int64_t>(std::max(per_sm, 1)) * sms;
  while (S < kMaxCluster && tiles * 2 * S <= capacity && cols / kChunk / (2 * S) >= 2) S *= 2;
  return S;
}

template <int NT>
cudaError_t LaunchNt(const GemvLaunch& a, const Tiles& tl, cudaStream_t stream) {
  constexpr int smem = Geo<NT>::kSmem;
  static const cudaError_t attr =
      cudaFuncSetAttribute(GemvQ8WideKernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (attr != cudaSuccess) return attr;
  const int64_t tiles = tl.begin[a.num_matrices];
  static const int per_sm = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, GemvQ8WideKernel<NT>, kThreads, Geo<NT>::kSmem) !=
        cudaSuccess) {
      cudaGetLastError();
      return 1;
    }
    return n;
  }();
  const int S = PickSplit(tiles, a.cols, per_sm);
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = PdlEnabled() ? 1 : 0;
  at[1].id = cudaLaunchAttributeClusterDimension;
  at[1].val.clusterDim.x = static_cast<unsigned>(S);
  at[1].val.clusterDim.y = 1;
  at[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(tiles * S));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = at;
  cfg.numAttrs = S > 1 ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, GemvQ8WideKernel<NT>, a, tl, S);
}

}  // namespace

bool GemvWideOn() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_GEMV_WIDE");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
}

bool GemvWideTakes(GemvWeight wtype, bool x_f32, int64_t cols, int64_t tokens) {
  return GemvWideOn() && wtype == GemvWeight::kQ8 && !x_f32 && tokens > kGemvMaxTokens &&
         tokens <= kGemvWideMaxTokens && cols > 0 && cols % kChunk == 0;
}

cudaError_t LaunchGemvQ8Wide(const GemvLaunch& a, cudaStream_t stream) {
  Tiles tl;
  for (int i = 0; i < a.num_matrices; ++i) tl.begin[i + 1] = tl.begin[i] + (a.m[i].rows + kTileRows - 1) / kTileRows;
  using Launch = cudaError_t (*)(const GemvLaunch&, const Tiles&, cudaStream_t);
  static constexpr Launch kByTiles[] = {nullptr,     nullptr,     LaunchNt<2>, LaunchNt<3>, LaunchNt<4>,
                                        LaunchNt<5>, LaunchNt<6>, LaunchNt<7>, LaunchNt<8>};  // [n8 token tiles]
  const int nt = (a.num_tokens + 7) / 8;
  if (nt < 2 || nt > 8) return cudaErrorInvalidValue;
  return kByTiles[nt](a, tl, stream);
}

}  // namespace moeshard::gpu
