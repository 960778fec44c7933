// Warpgroup MMA (wgmma, sm_90a) for the attention and MoE kernels: shared-memory matrix descriptors for the
// 128-byte swizzled layout, the fence / commit / wait instructions, and bf16 x bf16 -> fp32 MMAs
// of 64 rows by N = 64, 128 or 256 columns by 16 (operands from shared memory, or A from registers).
//
// The 128-byte swizzle (the descriptor's layout 1): a tile of rows of 64 bf16 (128 bytes) is
// stored row after row, 16-byte chunk c of row r at chunk c ^ (r % 8), each 8-row group (1,024
// bytes) 1,024-byte aligned. A K-major operand (rows along M or N, 64 elements of K per row)
// steps 8-row groups by the stride byte offset; 16 more elements of K are 32 bytes further into
// the row. An MN-major operand (rows along K, 64 elements of M or N per row) steps 8-row groups
// (along K) by the stride byte offset and 64-element column blocks (along M or N) by the
// leading byte offset. Valid only where __CUDA_ARCH_FEAT_SM90_ALL is defined (sm_90a).
#pragma once

#include <cstdint>

#include "kernels/cuda/wgmma_rs.cuh"

namespace moeshard::gpu {

// The descriptor of a 128-byte-swizzled operand starting at shared address `addr`.
__device__ __forceinline__ uint64_t WgmmaDesc(uint32_t addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (static_cast<uint64_t>((leading_bytes >> 4) & 0x3fff) << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3fff) << 32) | (uint64_t{1} << 62);
}

// The descriptor `desc` (WgmmaDesc) moved `bytes` further into shared memory, a multiple of 16 that
// keeps the operand inside the CTA's shared memory: only the 14-bit start field changes, and it
// cannot carry into the next field (shared addresses stay below 2^18). One 32-bit add where
// WgmmaDesc of the moved address is a mask, a shift and an OR more (in the uniform datapath, per
// wgmma: kernels/moe/PERF_NOTES.md).
__device__ __forceinline__ uint64_t WgmmaDescAdd(uint64_t desc, uint32_t bytes) {
  uint64_t out;
  asm("{\n.reg .b32 lo, hi;\nmov.b64 {lo, hi}, %1;\nadd.u32 lo, lo, %2;\nmov.b64 %0, {lo, hi};\n}\n"
      : "=l"(out)
      : "l"(desc), "r"(bytes >> 4));
  return out;
}

// Orders this warpgroup's register and shared-memory accesses before the next wgmma.
__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across a wgmma wait.
template <int K>
__device__ __forceinline__ void WgmmaPin(float (&d)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Generic-proxy writes to shared memory (st.shared, cp.async) before wgmma reads them.
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// D (64 x 64, fp32) {=, +=} A (64 x 16: shared memory, K-major) x B (16 x 64: shared memory,
// K-major, i.e. B's columns contiguous along K); scale_d 0 overwrites D, 1 accumulates.
__device__ __forceinline__ void WgmmaSS64(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D (64 x 64, fp32) {=, +=} A (64 x 16: bf16 registers, each warp's 16 rows as the m16n8k16 A
// fragment) x B (16 x 64: shared memory, MN-major, i.e. B's rows contiguous along N).
__device__ __forceinline__ void WgmmaRS64TransB(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                uint64_t desc_b, int scale_d) {
  WgmmaRS<64, 1>(d, a0, a1, a2, a3, desc_b, scale_d);
}

// D (64 x 128, fp32) {=, +=} A (64 x 16: shared memory, K-major) x B (16 x 128: shared memory,
// K-major, i.e. B's columns contiguous along K); scale_d 0 overwrites D, 1 accumulates.
__device__ __forceinline__ void WgmmaSS128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// Eight accumulator operands d[o..o+7] of an asm statement (WgmmaSS256's 128).
#define MOESHARD_WG_D8(o)                                                                                     \
  "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]), \
      "+f"(d[o + 7])

// D (64 x 256, fp32) {=, +=} A (64 x 16: shared memory, K-major) x B (16 x 256: shared memory,
// K-major); scale_d 0 overwrites D, 1 accumulates. d[4j..4j+3] hold columns 8j..8j+7, as in
// WgmmaSS128's layout.
__device__ __forceinline__ void WgmmaSS256(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, "
      "%128, %129, p, 1, 1, 0, 0;\n}\n"
      : MOESHARD_WG_D8(0), MOESHARD_WG_D8(8), MOESHARD_WG_D8(16), MOESHARD_WG_D8(24), MOESHARD_WG_D8(32),
        MOESHARD_WG_D8(40), MOESHARD_WG_D8(48), MOESHARD_WG_D8(56), MOESHARD_WG_D8(64), MOESHARD_WG_D8(72),
        MOESHARD_WG_D8(80), MOESHARD_WG_D8(88), MOESHARD_WG_D8(96), MOESHARD_WG_D8(104), MOESHARD_WG_D8(112),
        MOESHARD_WG_D8(120)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
#undef MOESHARD_WG_D8

// D (64 x 128, fp32) {=, +=} A (64 x 16: bf16 registers, each warp's 16 rows as the m16n8k16 A
// fragment) x B (16 x 128: shared memory, MN-major, i.e. B's rows contiguous along N).
__device__ __forceinline__ void WgmmaRS128TransB(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                 uint64_t desc_b, int scale_d) {
  WgmmaRS<128, 1>(d, a0, a1, a2, a3, desc_b, scale_d);
}

}  // namespace moeshard::gpu
