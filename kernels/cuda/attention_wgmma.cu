// Causal paged attention on the Hopper warpgroup MMA (wgmma, sm_90a) for prefill: bf16
// activations over a bf16 cache, head_dim 64 or 128, query heads per KV head dividing 128
// (issue 14's FA3-style prefill kernel; FP8 caches reach it through the runner's bf16 copy).
//
// One CTA per (tile of 128 / group consecutive tokens, KV head): 128 query rows, row r head
// r % group of token r / group (as attention_tc.cu), two warpgroups of 64 rows each. Keys go in
// tiles of 128, gathered from the paged cache by cp.async into the 128-byte swizzled layout of
// wgmma.cuh, double-buffered (tile i + 1 in flight while tile i is computed). Per tile, each
// warpgroup: S = Q Kᵀ by wgmma m64n128k16 with Q and K in shared memory (both K-major); the
// causal and window masks and the online softmax on S's fragments in fp32 (exp2, the scale
// folded into the scores); P rounded to bf16 in registers as the A operand of O += P V (wgmma,
// V in shared memory as an MN-major B). A warpgroup skips tiles that none of its rows sees.
// This is the first version (every thread copies and computes); the default is its warp-specialized
// form (attention_wgmma_ws.cu). MOESHARD_ATTN_WGMMA=0 leaves both out of kAuto, =1 picks this one.
#include <climits>
#include <cstdlib>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/attention_wgmma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOESHARD_WGMMA_DEVICE 1
#endif

namespace moeshard::gpu {
namespace {

constexpr int kWgThreads = 256;

// Q [HD/64][128 rows][64] and two buffers each of K and V [HD/64][128 keys][64] (bf16, swizzled),
// the rows' positions and first visible keys, and up to 1 KB to align the tiles to 1,024 bytes.
template <int HD>
constexpr size_t WgSmemBytes() {
  return size_t{kWgRows} * HD * 2 + 4 * size_t{kWgKeys} * HD * 2 + 2 * kWgRows * sizeof(int) + 1024;
}

template <int HD>
__global__ void __launch_bounds__(kWgThreads, 1) WgmmaAttentionKernel(AttentionParams p, int group, int tile_tokens) {
#ifdef MOESHARD_WGMMA_DEVICE
  constexpr int CH = HD / 8;           // 16-byte chunks of a row
  constexpr uint32_t kQBytes = kWgRows * HD * 2, kTileBytes = kWgKeys * HD * 2;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* sm = smem_raw + (base - raw);
  uint8_t* k_tiles = sm + kQBytes;               // [2][kTileBytes]
  uint8_t* v_tiles = k_tiles + 2 * kTileBytes;   // [2][kTileBytes]
  int* rpos = reinterpret_cast<int*>(v_tiles + 2 * kTileBytes);
  int* rfirst = rpos + kWgRows;
  __shared__ int s_range[3][4];  // [CTA, warpgroup 0, warpgroup 1][first key, last key, ...]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wg = warp / 4;
  const int gq = lane / 4, tq = lane % 4;
  const int64_t nkv = p.cache.num_kv_heads, bs = p.cache.block_size;
  const int64_t g = blockIdx.y;
  const int64_t tile = static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x;
  const int64_t t_begin = tile * tile_tokens, t_end = min(p.num_tokens, t_begin + tile_tokens);
  const int64_t q_stride = p.q_stride ? p.q_stride : p.num_heads * HD;
  const int rows_used = tile_tokens * group;
  const uint16_t* qbase = static_cast<const uint16_t*>(p.q);
  const uint16_t* kc = static_cast<const uint16_t*>(p.cache.k);
  const uint16_t* vc = static_cast<const uint16_t*>(p.cache.v);
  const int row0 = wg * 64 + (warp % 4) * 16 + gq;  // this thread's rows: row0 and row0 + 8
  const float scale_log2 = p.scale * 1.4426950408889634f;

  for (int64_t s0 = t_begin; s0 < t_end;) {
    const int64_t s1 = SameTableEnd(p, s0, t_end);
    const int32_t* table = p.block_tables + p.table_offset[s0];
    __syncthreads();  // the previous run is done with Q and the row positions
    StoreRowPositions(p, s0, s1, group, rows_used, kWgRows, tid, rpos, rfirst);
    for (int i = tid; i < kWgRows * CH; i += kWgThreads) {
      const int r = i / CH, c = i % CH;
      const int64_t t = s0 + r / group;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows_used && t < s1) {
        v = *reinterpret_cast<const uint4*>(qbase + t * q_stride + (g * group + r % group) * HD + c * 8);
      }
      *reinterpret_cast<uint4*>(sm + SwizzledChunk(r, c, kWgRows)) = v;
    }
    FenceProxyAsyncShared();
    __syncthreads();
    if (warp == 0) WgKeyRanges(rpos, rfirst, lane, s_range);
    __syncthreads();
    const int k_lo = s_range[0][0], k_hi = s_range[0][1];
    const int wg_lo = s_range[1 + wg][0], wg_hi = s_range[1 + wg][1];
    const int my_pos[2] = {rpos[row0], rpos[row0 + 8]};
    const int my_first[2] = {rfirst[row0], rfirst[row0 + 8]};

    float o[HD / 2], s[kWgKeys / 2];
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
#pragma unroll
    for (int i = 0; i < kWgKeys / 2; ++i) s[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // m: scores times scale * log2(e)

    // Keys [k0, k0 + 128) into buffer b: chunk c of key k at its swizzled place; keys past k_hi
    // (no row sees them) are zero-filled.
    auto copy_tile = [&](int k0, int b) {
      uint8_t* dk = k_tiles + b * kTileBytes;
      uint8_t* dv = v_tiles + b * kTileBytes;
#pragma unroll
      for (int j = 0; j < kWgKeys * CH / kWgThreads; ++j) {
        const int i = tid + j * kWgThreads;
        const int key = i / CH, c = i % CH;
        const int kp = k0 + key;
        const bool valid = kp <= k_hi;
        int64_t off = 0;
        if (valid) off = ((static_cast<int64_t>(table[kp / bs]) * bs + kp % bs) * nkv + g) * HD + c * 8;
        const uint32_t so = SwizzledChunk(key, c, kWgKeys);
        CpAsync16(dk + so, kc + off, valid);
        CpAsync16(dv + so, vc + off, valid);
      }
      CpCommit();
    };

    const int ntiles = k_hi >= k_lo ? (k_hi - k_lo) / kWgKeys + 1 : 0;
    if (ntiles > 0) copy_tile(k_lo, 0);
    for (int it = 0; it < ntiles; ++it) {
      const int k0 = k_lo + it * kWgKeys, b = it & 1;
      if (it + 1 < ntiles) {
        copy_tile(k0 + kWgKeys, b ^ 1);  // that buffer's last reader finished at the last barrier
        CpWait<1>();
      } else {
        CpWait<0>();
      }
      FenceProxyAsyncShared();
      __syncthreads();  // tile `it` is in shared memory, visible to the wgmma
      if (k0 <= wg_hi && k0 + kWgKeys - 1 >= wg_lo) {
        const uint32_t k_addr = static_cast<uint32_t>(__cvta_generic_to_shared(k_tiles + b * kTileBytes));
        const uint32_t v_addr = static_cast<uint32_t>(__cvta_generic_to_shared(v_tiles + b * kTileBytes));
        WgAttendTile<HD>(s, o, m, l, base + wg * 64 * 128, k_addr, v_addr, k0, my_pos, my_first, tq, scale_log2);
      }
      __syncthreads();  // every warpgroup is done with buffer b
    }
    WgStoreRows<HD>(p, o, l, my_pos, row0, s0, group, g, tq);
    s0 = s1;
  }
#else
  __trap();  // built without sm_90a: WgmmaAttentionSupports() never picks this kernel
#endif
}

// MOESHARD_ATTN_WGMMA: 0 leaves the wgmma kernels out of kAuto, 1 picks this file's two-warpgroup
// kernel, anything else (or unset) the warp-specialized one (attention_wgmma_ws.cu).
int WgmmaMode() {
  static const int mode = [] {
    const char* v = std::getenv("MOESHARD_ATTN_WGMMA");
    return v == nullptr ? 2 : v[0] == '0' ? 0 : v[0] == '1' ? 1 : 2;
  }();
  return mode;
}

// Compute capability 9.0 (the sm_90a code), per device, read once.
bool DeviceIsSm90() {
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

template <int HD>
cudaError_t LaunchWgmmaHd(const AttentionParams& p, cudaStream_t st) {
  const WgGrid w = WgLaunchGrid(p);
  constexpr size_t smem = WgSmemBytes<HD>();
  auto* k = &WgmmaAttentionKernel<HD>;
  static std::atomic<uint64_t> smem_set{0};
  if (cudaError_t e = EnsureDynamicSmem(k, smem, smem_set); e != cudaSuccess) return e;
  k<<<w.grid, kWgThreads, smem, st>>>(p, w.group, w.tile_tokens);
  return cudaGetLastError();
}

}  // namespace

bool WgmmaAttentionSupports(const AttentionParams& p) {
#ifndef MOESHARD_HAVE_SM90A
  (void)p;
  return false;
#else
  const KvCacheView& c = p.cache;
  if (p.dtype != ActDType::kBF16 || c.elem != KvElem::kBF16 || (c.head_dim != 64 && c.head_dim != 128)) return false;
  if (c.num_kv_heads <= 0 || p.num_heads % c.num_kv_heads != 0) return false;
  const int64_t group = p.num_heads / c.num_kv_heads;
  if (group < 1 || group > kWgRows || kWgRows % group != 0) return false;
  const auto aligned = [](const void* q, uintptr_t a) { return reinterpret_cast<uintptr_t>(q) % a == 0; };
  if (!aligned(p.q, 16) || !aligned(c.k, 16) || !aligned(c.v, 16) || !aligned(p.out, 4)) return false;
  if (p.q_stride % 8 != 0 || p.out_stride % 2 != 0) return false;
  return WgmmaMode() != 0 && DeviceIsSm90();
#endif
}

cudaError_t LaunchAttentionWgmma(const AttentionParams& p, cudaStream_t st) {
  if (WgmmaMode() != 1) return LaunchAttentionWgmmaWs(p, st);
  return p.cache.head_dim == 64 ? LaunchWgmmaHd<64>(p, st) : LaunchWgmmaHd<128>(p, st);
}

}  // namespace moeshard::gpu
