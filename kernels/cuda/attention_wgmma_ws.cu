// The wgmma prefill attention (kAuto's prefill kernel on sm_90; attention_wgmma.cu says which
// shapes it takes), warp-specialized.
//
// Three warpgroups: warpgroup 0 gathers key tiles from the paged cache by cp.async (the slot of
// each of a tile's 128 keys looked up once, by one thread, then 16-byte chunks into the swizzled
// layout) into a two-slot ring and signals each slot's "full" mbarrier as its copies land;
// warpgroups 1 and 2 each own 64 query rows, wait for a slot, attend it and release it on its
// "empty" mbarrier, so the copies' address work never holds their MMAs back. The consumers take
// turns issuing S = Q Kᵀ (named barriers; MOESHARD_ATTN_WGMMA_PINGPONG=0 off), so one's softmax
// runs beside the other's MMAs; tiles that every row of a warpgroup sees whole skip the masks.
// (Issuing the next tile's S before a tile's softmax, within a warpgroup, needs a second S in
// registers: past the 168 a thread ptxas allocates for 384 threads, it spills and serializes.)
// The producer gives registers up (setmaxnreg) to the two consumers.
#include <climits>
#include <cstdlib>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/mbarrier.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOESHARD_WGMMA_DEVICE 1
#endif

namespace moeshard::gpu {
namespace {

constexpr int kWsThreads = 384, kStages = 2;

// MOESHARD_ATTN_WGMMA_PINGPONG=0: the consumer warpgroups issue their MMAs without taking turns.
int PingPong() {
  static const int on = [] {
    const char* v = std::getenv("MOESHARD_ATTN_WGMMA_PINGPONG");
    return v == nullptr || v[0] != '0' ? 1 : 0;
  }();
  return on;
}

// Q [HD/64][128 rows][64], kStages slots of K and of V [HD/64][128 keys][64] (bf16, swizzled), the
// rows' positions and first keys, each slot's key slots, and 1 KB to align the tiles.
template <int HD>
constexpr size_t WsSmemBytes() {
  return size_t{kWgRows} * HD * 2 + 2 * kStages * size_t{kWgKeys} * HD * 2 + 2 * kWgRows * sizeof(int) +
         kStages * kWgKeys * sizeof(int) + 1024;
}

template <int HD>
__global__ void __launch_bounds__(kWsThreads, 1) WgmmaWsAttentionKernel(AttentionParams p, int group, int tile_tokens,
                                                                         int pingpong) {
#ifdef MOESHARD_WGMMA_DEVICE
  constexpr int CH = HD / 8;  // 16-byte chunks of a row
  constexpr uint32_t kQBytes = kWgRows * HD * 2, kTileBytes = kWgKeys * HD * 2;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = SharedAddr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* sm = smem_raw + (base - raw);
  uint8_t* k_tiles = sm + kQBytes;                     // [kStages][kTileBytes]
  uint8_t* v_tiles = k_tiles + kStages * kTileBytes;   // [kStages][kTileBytes]
  int* rpos = reinterpret_cast<int*>(v_tiles + kStages * kTileBytes);
  int* rfirst = rpos + kWgRows;
  int* kslot = rfirst + kWgRows;  // [kStages][kWgKeys]: cache slot of each key, -1 past k_hi
  __shared__ alignas(8) uint64_t full[kStages], empty[kStages];
  __shared__ int s_range[3][4];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wg = warp / 4;
  const int64_t g = blockIdx.y;
  const int64_t tile = static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x;
  const int64_t t_begin = tile * tile_tokens, t_end = min(p.num_tokens, t_begin + tile_tokens);
  const int rows_used = tile_tokens * group;
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      MbarrierInit(&full[i], 128);  // one cp.async arrival per producer thread
      MbarrierInit(&empty[i], 256);  // every consumer thread
    }
  }
  __syncthreads();
  // The two roles in separate code (each under its own register budget), meeting at the same
  // three CTA barriers per run of tokens sharing a block table: (A) the previous run is done with
  // Q, the row positions and the ring; (B) positions and Q stored; (C) the key ranges known.
  uint32_t cnt = 0;  // key tiles through the ring so far (both roles count the same)
  if (wg == 0) {
    RegsDecrease<40>();
    const int bs = static_cast<int>(p.cache.block_size);
    const int64_t nkv = p.cache.num_kv_heads;
    const uint16_t* kc = static_cast<const uint16_t*>(p.cache.k);
    const uint16_t* vc = static_cast<const uint16_t*>(p.cache.v);
    for (int64_t s0 = t_begin; s0 < t_end;) {
      const int64_t s1 = SameTableEnd(p, s0, t_end);
      NamedBarrierSync(2, kWsThreads);  // A
      StoreRowPositions(p, s0, s1, group, rows_used, kWgRows, tid, rpos, rfirst);
      NamedBarrierSync(2, kWsThreads);  // B
      if (warp == 0) WgKeyRanges(rpos, rfirst, lane, s_range);
      NamedBarrierSync(2, kWsThreads);  // C
      const int k_lo = s_range[0][0], k_hi = s_range[0][1];
      const int ntiles = k_hi >= k_lo ? (k_hi - k_lo) / kWgKeys + 1 : 0;
      const PagedSlots slots(p.block_tables + p.table_offset[s0], bs);
      for (int it = 0; it < ntiles; ++it, ++cnt) {
        const int st = cnt % kStages;
        MbarrierWait(&empty[st], ((cnt / kStages) & 1) ^ 1);
        const int kp = k_lo + it * kWgKeys + tid;
        kslot[st * kWgKeys + tid] = kp <= k_hi ? slots(kp) : -1;
        NamedBarrierSync(1, 128);
        uint8_t* dk = k_tiles + st * kTileBytes;
        uint8_t* dv = v_tiles + st * kTileBytes;
        const int c = tid % CH;
#pragma unroll 4
        for (int key = tid / CH; key < kWgKeys; key += 128 / CH) {
          const int slot = kslot[st * kWgKeys + key];
          const int64_t off = slot >= 0 ? (static_cast<int64_t>(slot) * nkv + g) * HD + c * 8 : 0;
          const uint32_t so = SwizzledChunk(key, c, kWgKeys);
          CpAsync16(dk + so, kc + off, slot >= 0);
          CpAsync16(dv + so, vc + off, slot >= 0);
        }
        MbarrierArriveOnCpAsync(&full[st]);
      }
      s0 = s1;
    }
  } else {
    RegsIncrease<232>();
    const int cw = wg - 1, gq = lane / 4, tq = lane % 4;
    if (pingpong && cw == 1) NamedBarrierArrive(3, 256);  // warpgroup 1's first turn goes first
    const int row0 = cw * 64 + (warp % 4) * 16 + gq;
    const float scale_log2 = p.scale * 1.4426950408889634f;
    const int64_t q_stride = p.q_stride ? p.q_stride : p.num_heads * HD;
    const uint16_t* qbase = static_cast<const uint16_t*>(p.q);
    for (int64_t s0 = t_begin; s0 < t_end;) {
      const int64_t s1 = SameTableEnd(p, s0, t_end);
      NamedBarrierSync(2, kWsThreads);  // A
      for (int i = tid - 128; i < kWgRows * CH; i += 256) {
        const int r = i / CH, c = i % CH;
        const int64_t t = s0 + r / group;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < rows_used && t < s1) {
          v = *reinterpret_cast<const uint4*>(qbase + t * q_stride + (g * group + r % group) * HD + c * 8);
        }
        *reinterpret_cast<uint4*>(sm + SwizzledChunk(r, c, kWgRows)) = v;
      }
      FenceProxyAsyncShared();
      NamedBarrierSync(2, kWsThreads);  // B
      NamedBarrierSync(2, kWsThreads);  // C
      const int k_lo = s_range[0][0], k_hi = s_range[0][1];
      const int ntiles = k_hi >= k_lo ? (k_hi - k_lo) / kWgKeys + 1 : 0;
      const int my_pos[2] = {rpos[row0], rpos[row0 + 8]};
      const int my_first[2] = {rfirst[row0], rfirst[row0 + 8]};
      float o[HD / 2], s[kWgKeys / 2];
#pragma unroll
      for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
#pragma unroll
      for (int i = 0; i < kWgKeys / 2; ++i) s[i] = 0.f;
      float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
      const int wg_first_max = s_range[1 + cw][2], wg_pos_min = s_range[1 + cw][3];
      for (int it = 0; it < ntiles; ++it, ++cnt) {
        const int st = cnt % kStages, k0 = k_lo + it * kWgKeys;
        MbarrierWait(&full[st], (cnt / kStages) & 1);
        FenceProxyAsyncShared();  // the landed copies, before the wgmma reads them
        // Ping-pong: the warpgroups take turns issuing S (each waits for its turn, then hands the
        // turn over), so one's softmax runs beside the other's MMAs. Every warpgroup attends every
        // tile of the CTA's range (the masks zero what its rows do not see): a wgmma on a branch
        // the compiler cannot prove uniform would be serialized.
        if (pingpong) NamedBarrierSync(3 + cw, 256);
        WgIssueScores<HD>(s, base + cw * 64 * 128, SharedAddr(k_tiles + st * kTileBytes));
        if (pingpong) NamedBarrierArrive(3 + (cw ^ 1), 256);
        const bool whole = k0 >= wg_first_max && k0 + kWgKeys - 1 <= wg_pos_min;
        WgSoftmaxPv<HD>(s, o, m, l, SharedAddr(v_tiles + st * kTileBytes), k0, my_pos, my_first, tq, scale_log2,
                        !whole);
        MbarrierArrive(&empty[st]);
      }
      WgStoreRows<HD>(p, o, l, my_pos, row0, s0, group, g, tq);
      s0 = s1;
    }
  }
#else
  __trap();  // built without sm_90a: WgmmaAttentionSupports() never picks this kernel
#endif
}

template <int HD>
cudaError_t LaunchWgmmaWsHd(const AttentionParams& p, cudaStream_t st) {
  const WgGrid w = WgLaunchGrid(p);
  constexpr size_t smem = WsSmemBytes<HD>();
  auto* k = &WgmmaWsAttentionKernel<HD>;
  static std::atomic<uint64_t> smem_set{0};
  if (cudaError_t e = EnsureDynamicSmem(k, smem, smem_set); e != cudaSuccess) return e;
  k<<<w.grid, kWsThreads, smem, st>>>(p, w.group, w.tile_tokens, PingPong());
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAttentionWgmma(const AttentionParams& p, cudaStream_t st) {
  return p.cache.head_dim == 64 ? LaunchWgmmaWsHd<64>(p, st) : LaunchWgmmaWsHd<128>(p, st);
}

}  // namespace moeshard::gpu
