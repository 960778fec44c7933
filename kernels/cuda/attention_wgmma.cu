// The wgmma prefill attention's host side: whether it can run a batch on this device (kAuto's
// choice, gpu_ops.cc) and its launch. The kernel is attention_wgmma_ws.cu (a producer warpgroup
// and two consumer warpgroups; the shared tile work in attention_wgmma.cuh). Caches of 16-token
// multiple blocks whose num_blocks is set are copied by tensor-map boxes (MOESHARD_ATTN_WGMMA_TMA=0:
// the cp.async gather). It takes bf16
// activations over a bf16 cache, head_dim 64 or 128, query heads per KV head dividing 128, on a
// compute capability 9.0 device of a build with sm_90a code (FP8 caches reach it through the
// runner's bf16 copy). MOESHARD_ATTN_WGMMA=0 in the environment leaves it out of kAuto.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>

#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/pdl.cuh"

namespace moeshard::gpu {
namespace {

bool WgmmaAllowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("MOESHARD_ATTN_WGMMA");
    return v == nullptr || v[0] != '0';
  }();
  return allowed;
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
  return WgmmaAllowed() && DeviceIsSm90();
#endif
}

}  // namespace moeshard::gpu
