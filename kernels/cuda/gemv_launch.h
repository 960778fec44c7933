// Internal: the launch-side view of GemvParams (gemv.cc validates and fills it; gemv.cu runs it).
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/gemv.h"

namespace moeshard::gpu {

// Dynamic shared memory a GEMV block may take for x (fp32 [TB, K]).
inline constexpr int kGemvMaxSmemBytes = 64 * 1024;

struct GemvLaunch {
  GemvWeight wtype = GemvWeight::kBF16;
  const void* x = nullptr;
  int x_f32 = 0;
  int64_t x_stride = 0;
  int y_f32 = 0;
  int64_t cols = 0;
  int num_tokens = 0;  // ≤ GemvTokensPerLaunch(cols)
  GemvMatrix m[3];     // y_stride filled in
  int num_matrices = 1;
  int64_t task_begin[4] = {};  // warp tasks: matrix i owns [task_begin[i], task_begin[i + 1])
  int rows_per_task = 2;       // GemvRowsPerTask
  GemvResidualIn res;          // res.s: x from the residual prologue (fp32 x path)
};

int GemvTokensPerLaunch(int64_t cols);  // tokens whose fp32 x fits kGemvMaxSmemBytes (1..8)
// Rows a warp computes: 2, or 1 for one token of split Q8 rows longer than one round of loads
// (K > 2048), so that a lane's loads cover its whole row before the kernel's PDL wait.
int GemvRowsPerTask(GemvWeight wtype, int64_t cols, int64_t num_tokens);
cudaError_t LaunchGemv(const GemvLaunch& a, cudaStream_t stream);
// gemv_mma.cu: split Q8 with bf16 x for 2 to 8 tokens on the tensor cores (LaunchGemv takes it
// unless MOESHARD_GEMV_MMA=0).
bool GemvMmaTakes(const GemvLaunch& a);
// Whether LaunchGemv hands split Q8 with bf16 x to gemv_mma.cu (MOESHARD_GEMV_MMA, default on).
bool GemvMmaOn();
// The most tokens (2..8) of bf16 x one gemv_mma.cu launch takes at this K (its x in shared
// memory as bf16), 0 if none.
int GemvMmaTokensPerLaunch(int64_t cols);
cudaError_t LaunchGemvQ8Mma(const GemvLaunch& a, cudaStream_t stream);
// gemv_wide.cu: split Q8 with bf16 x for 9 to kGemvWideMaxTokens tokens (GemvWideTakes).
cudaError_t LaunchGemvQ8Wide(const GemvLaunch& a, cudaStream_t stream);
cudaError_t LaunchGemvSplitQ8(const WeightRef& w, int8_t* codes, uint16_t* scales, cudaStream_t stream);
cudaError_t LaunchGemvExpandQ8(const int8_t* codes, const uint16_t* scales, int64_t n, void* out, bool out_f32,
                               cudaStream_t stream);

}  // namespace moeshard::gpu
