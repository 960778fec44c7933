// The wgmma prefill attention (kAuto's prefill kernel on sm_90; attention_wgmma.cu says which
// shapes it takes), warp-specialized.
//
// Three warpgroups. Warpgroup 0 fills two rings in shared memory, one of K tiles and one of V
// tiles (128 keys each, swizzled; 3 slots each at head_dim 128, 4 at 64): with a paged cache of
// 16-token multiples one thread of its first warp a block copies the block's rows with one
// tensor-map box per 64 columns (bytes counted on the slot's "full" mbarrier); with other block
// sizes its 128 threads gather 16-byte chunks by cp.async (two slots a ring). Warpgroups 1 and 2
// each own 64 query rows and walk the tiles with FA3's overlap inside a warpgroup: tile j's
// scores S_j and the previous tile's O += P_{j-1} V_{j-1} are issued together, and the softmax of
// S_j runs while the tensor cores finish P V; each ring slot goes back to the producer ("empty")
// as soon as its wgmma has read it (K after S, V after P V). The two consumers take turns issuing
// (named barriers; MOESHARD_ATTN_WGMMA_PINGPONG=0 off), so one's softmax also runs beside the
// other's MMAs; tiles that every row of a warpgroup sees whole skip the masks. The producer gives
// registers up (setmaxnreg) so the consumers hold O, S and P (ptxas allocates the raised budget
// in the consumers' code).
#include <climits>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/tensor_map.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOESHARD_WGMMA_DEVICE 1
#endif

namespace moeshard::gpu {
namespace {

constexpr int kWsThreads = 384;

// MOESHARD_ATTN_WGMMA_PINGPONG=0: the consumer warpgroups issue their MMAs without taking turns.
int PingPong() {
  static const int on = [] {
    const char* v = std::getenv("MOESHARD_ATTN_WGMMA_PINGPONG");
    return v == nullptr || v[0] != '0' ? 1 : 0;
  }();
  return on;
}

// MOESHARD_ATTN_WGMMA_TMA=0: the cp.async gather even where tensor-map boxes could copy blocks.
bool TmaAllowed() {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_ATTN_WGMMA_TMA");
    return v == nullptr || v[0] != '0';
  }();
  return on;
}

// Shared memory: Q [HD/64][128 rows][64], kStages K tiles then kStages V tiles [HD/64][128 keys][64]
// (bf16, swizzled), the rows' positions and first keys, the cp.async gather's key slots (two
// tiles'), and 1 KB to align the tiles. At head_dim 128 three slots a ring fill the 227 KB a CTA
// may have; the gather's slot lists leave room for two.
template <int HD, bool kTma>
struct WsGeo {
  static constexpr int kStages = !kTma ? 2 : HD == 128 ? 3 : 4;
  static constexpr uint32_t kQBytes = kWgRows * HD * 2, kTileBytes = kWgKeys * HD * 2;
  static constexpr size_t kSmem = kQBytes + 2 * kStages * size_t{kTileBytes} + 2 * kWgRows * sizeof(int) +
                                  (kTma ? 0 : 2 * kWgKeys * sizeof(int)) + 1024;
};

template <int HD, bool kTma>
__global__ void __launch_bounds__(kWsThreads, 1)
    WgmmaWsAttentionKernel(AttentionParams p, int group, int tile_tokens, int pingpong, int oob_slot,
                           const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap) {
#ifdef MOESHARD_WGMMA_DEVICE
  using G = WsGeo<HD, kTma>;
  constexpr int CH = HD / 8, S = G::kStages;  // 16-byte chunks of a row; ring slots
  constexpr uint32_t kTileBytes = G::kTileBytes;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = SharedAddr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* sm = smem_raw + (base - raw);
  uint8_t* k_tiles = sm + G::kQBytes;           // [S][kTileBytes]
  uint8_t* v_tiles = k_tiles + S * kTileBytes;  // [S][kTileBytes]
  int* rpos = reinterpret_cast<int*>(v_tiles + S * kTileBytes);
  int* rfirst = rpos + kWgRows;
  int* kslot = rfirst + kWgRows;  // cp.async gather: [2][kWgKeys] cache slot of each key, -1 past k_hi
  __shared__ alignas(8) uint64_t kfull[S], vfull[S], kempty[S], vempty[S];
  __shared__ int s_range[3][4];

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, wg = warp / 4;
  const int64_t g = blockIdx.y;
  const int64_t tile = static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x;
  const int64_t t_begin = tile * tile_tokens, t_end = min(p.num_tokens, t_begin + tile_tokens);
  const int rows_used = tile_tokens * group;
  if (tid == 0) {
    for (int i = 0; i < S; ++i) {
      MbarrierInit(&kfull[i], kTma ? 1 : 128);  // the box issuer's expect_tx, or every gathering thread
      MbarrierInit(&vfull[i], kTma ? 1 : 128);
      MbarrierInit(&kempty[i], 8);  // each consumer warp
      MbarrierInit(&vempty[i], 8);
    }
    if constexpr (kTma) FenceMbarrierInit();
  }
  __syncthreads();
  // The two roles in separate code (each under its own register budget), meeting at the same
  // three CTA barriers per run of tokens sharing a block table: (A) the previous run is done with
  // Q and the row positions; (B) positions and Q stored; (C) the key ranges known. Key tiles
  // start at the run's first visible key, rounded down to 16 for the tensor-map boxes.
  uint32_t cnt = 0;  // key tiles through the rings so far (both roles count the same)
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
      const int k_hi = s_range[0][1];
      const int k_lo = kTma ? s_range[0][0] & ~15 : s_range[0][0];
      const int ntiles = k_hi >= k_lo ? (k_hi - k_lo) / kWgKeys + 1 : 0;
      const PagedSlots slots(p.block_tables + p.table_offset[s0], bs);
      if constexpr (kTma) {
        if (warp == 0) {
          // Lane b < 8 copies the tile's 16-key block b: slot lookups a tile ahead of the waits.
          int kb = k_lo + lane * 16;
          int slot = lane < 8 && kb <= k_hi ? static_cast<int>(slots(kb)) : oob_slot;
          for (int it = 0; it < ntiles; ++it, ++cnt, kb += kWgKeys) {
            const int st = cnt % S;
            const uint32_t ph = ((cnt / S) & 1) ^ 1;
            const int kn = kb + kWgKeys;
            const int next = lane < 8 && kn <= k_hi && it + 1 < ntiles ? static_cast<int>(slots(kn)) : oob_slot;
#pragma unroll
            for (int part = 0; part < 2; ++part) {  // K, then V
              uint64_t* full = part == 0 ? &kfull[st] : &vfull[st];
              MbarrierWait(part == 0 ? &kempty[st] : &vempty[st], ph);
              if (lane == 0) MbarrierArriveExpectTx(full, kTileBytes);
              __syncwarp();
              if (lane < 8) {
                uint8_t* dst = (part == 0 ? k_tiles : v_tiles) + st * kTileBytes + lane * 16 * 128;
                const CUtensorMap* map = part == 0 ? &kmap : &vmap;
#pragma unroll
                for (int c = 0; c < HD / 64; ++c) {
                  TensorCopy3dToShared(dst + c * kWgKeys * 128, map, c * 64, static_cast<int>(g), slot, full);
                }
              }
            }
            slot = next;
          }
        } else {
          cnt += ntiles;
        }
      } else {
        for (int it = 0; it < ntiles; ++it, ++cnt) {
          const int st = cnt % S;
          const uint32_t ph = ((cnt / S) & 1) ^ 1;
          int* ks = kslot + (cnt & 1) * kWgKeys;
          const int kp = k_lo + it * kWgKeys + tid;
          ks[tid] = kp <= k_hi ? static_cast<int>(slots(kp)) : -1;
          NamedBarrierSync(1, 128);
          const int c = tid % CH;
#pragma unroll
          for (int part = 0; part < 2; ++part) {
            MbarrierWait(part == 0 ? &kempty[st] : &vempty[st], ph);
            uint8_t* dst = (part == 0 ? k_tiles : v_tiles) + st * kTileBytes;
            const uint16_t* src = part == 0 ? kc : vc;
#pragma unroll 4
            for (int key = tid / CH; key < kWgKeys; key += 128 / CH) {
              const int slot = ks[key];
              const int64_t off = slot >= 0 ? (static_cast<int64_t>(slot) * nkv + g) * HD + c * 8 : 0;
              CpAsync16(dst + SwizzledChunk(key, c, kWgKeys), src + off, slot >= 0);
            }
            MbarrierArriveOnCpAsync(part == 0 ? &kfull[st] : &vfull[st]);
          }
        }
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
    const uint32_t q_addr = base + cw * 64 * 128;
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
      const int k_hi = s_range[0][1];
      const int k_lo = kTma ? s_range[0][0] & ~15 : s_range[0][0];
      const int ntiles = k_hi >= k_lo ? (k_hi - k_lo) / kWgKeys + 1 : 0;
      const int my_pos[2] = {rpos[row0], rpos[row0 + 8]};
      const int my_first[2] = {rfirst[row0], rfirst[row0 + 8]};
      const int wg_first_max = s_range[1 + cw][2], wg_pos_min = s_range[1 + cw][3];
      float o[HD / 2], s[kWgKeys / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, corr[2];
      uint32_t pk[kWgKeys / 8][2];
#pragma unroll
      for (int i = 0; i < HD / 2; ++i) o[i] = 0.f;
      // S's softmax for the tile at k0 (masked unless every row of the warpgroup sees it whole).
      const auto softmax = [&](int k0) {
        if (!(k0 >= wg_first_max && k0 + kWgKeys - 1 <= wg_pos_min)) WgMask(s, k0, my_pos, my_first, tq);
        WgSoftmax(s, m, l, corr, scale_log2);
      };
      // Waits for tile st's K (and with_pv, the previous tile pst's V), takes the warpgroup's turn
      // and issues S (and P V).
      const auto issue = [&](auto with_pv, int st, int pst) {
        constexpr bool kPv = decltype(with_pv)::value;
        MbarrierWait(&kfull[st], (cnt / S) & 1);
        if constexpr (kPv) MbarrierWait(&vfull[pst], ((cnt - 1) / S) & 1);
        if constexpr (!kTma) FenceProxyAsyncShared();  // the gathered copies, before the wgmma reads them
        if (pingpong) NamedBarrierSync(3 + cw, 256);
        WgIssueScores<HD>(s, q_addr, SharedAddr(k_tiles + st * kTileBytes));
        if constexpr (kPv) WgIssuePv<HD>(o, pk, SharedAddr(v_tiles + pst * kTileBytes));
        if (pingpong) NamedBarrierArrive(3 + (cw ^ 1), 256);
      };
      // Tile 0's scores and softmax; then each tile's scores issued with the previous tile's P V,
      // its K slot released once S is in, its softmax while P V runs, the previous V slot released
      // and P packed for the next round; last, the last tile's P V.
      if (ntiles > 0) {
        {
          const int st = cnt % S;
          issue(std::false_type{}, st, 0);
          WgmmaWait<0>();
          WgmmaPin(s);
          if (lane == 0) MbarrierArrive(&kempty[st]);
          softmax(k_lo);
          WgPackP(s, pk);
          ++cnt;
        }
        for (int it = 1; it < ntiles; ++it, ++cnt) {
          const int st = cnt % S, pst = (cnt + S - 1) % S, k0 = k_lo + it * kWgKeys;
          issue(std::true_type{}, st, pst);
          WgmmaWait<1>();
          WgmmaPin(s);
          if (lane == 0) MbarrierArrive(&kempty[st]);
          softmax(k0);
          WgmmaWait<0>();
          WgmmaPin(o);
          WgPinP(pk);
          if (lane == 0) MbarrierArrive(&vempty[pst]);
          WgRescale<HD>(o, corr);
          WgPackP(s, pk);
        }
        const int pst = (cnt + S - 1) % S;
        MbarrierWait(&vfull[pst], ((cnt - 1) / S) & 1);
        if constexpr (!kTma) FenceProxyAsyncShared();
        WgIssuePv<HD>(o, pk, SharedAddr(v_tiles + pst * kTileBytes));
        WgmmaWait<0>();
        WgmmaPin(o);
        WgPinP(pk);
        if (lane == 0) MbarrierArrive(&vempty[pst]);
      }
      WgStoreRows<HD>(p, o, l, my_pos, row0, s0, group, g, tq);
      s0 = s1;
    }
  }
#else
  __trap();  // built without sm_90a: WgmmaAttentionSupports() never picks this kernel
#endif
}

// The K or V cache as a 3-D tensor [slots][KV heads][head_dim] for boxes of 16 slots of one
// head, 64 columns (128 bytes, swizzled) wide.
cudaError_t EncodeKvBoxes(const void* base, const KvCacheView& c, CUtensorMap* map) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(c.head_dim), static_cast<cuuint64_t>(c.num_kv_heads),
                              static_cast<cuuint64_t>(c.num_blocks * c.block_size)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(c.head_dim * 2),
                                 static_cast<cuuint64_t>(c.num_kv_heads * c.head_dim * 2)};
  const cuuint32_t box[3] = {64, 1, 16}, elem[3] = {1, 1, 1};
  const CUresult r = TensorMapEncoder()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims,
                                        strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Tensor-map boxes take a cache of 16-token multiples whose slots fit a 32-bit coordinate.
bool UseBoxes(const KvCacheView& c) {
  static const bool maps = TensorMapEncoder() != nullptr;
  return maps && TmaAllowed() && c.block_size > 0 && c.block_size % 16 == 0 && c.num_blocks > 0 &&
         c.num_blocks * c.block_size < (int64_t{1} << 31) - 16;
}

template <int HD, bool kTma>
cudaError_t LaunchWgmmaWsHd(const AttentionParams& p, cudaStream_t st) {
  const WgGrid w = WgLaunchGrid(p);
  constexpr size_t smem = WsGeo<HD, kTma>::kSmem;
  auto* k = &WgmmaWsAttentionKernel<HD, kTma>;
  static std::atomic<uint64_t> smem_set{0};
  if (cudaError_t e = EnsureDynamicSmem(k, smem, smem_set); e != cudaSuccess) return e;
  CUtensorMap kmap{}, vmap{};  // host encoding only: the launch copies them
  if constexpr (kTma) {
    if (cudaError_t e = EncodeKvBoxes(p.cache.k, p.cache, &kmap); e != cudaSuccess) return e;
    if (cudaError_t e = EncodeKvBoxes(p.cache.v, p.cache, &vmap); e != cudaSuccess) return e;
  }
  const int oob = static_cast<int>(p.cache.num_blocks * p.cache.block_size);  // a box past the cache: zeros
  k<<<w.grid, kWsThreads, smem, st>>>(p, w.group, w.tile_tokens, PingPong(), oob, kmap, vmap);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAttentionWgmma(const AttentionParams& p, cudaStream_t st) {
  if (UseBoxes(p.cache)) {
    return p.cache.head_dim == 64 ? LaunchWgmmaWsHd<64, true>(p, st) : LaunchWgmmaWsHd<128, true>(p, st);
  }
  return p.cache.head_dim == 64 ? LaunchWgmmaWsHd<64, false>(p, st) : LaunchWgmmaWsHd<128, false>(p, st);
}

}  // namespace moeshard::gpu
