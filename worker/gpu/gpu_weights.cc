#include "worker/gpu/gpu_weights.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/gpu_ops.h"
#include "worker/gpu/expert_repack.h"

namespace moeshard::gpu {
namespace {

class Uploader {
 public:
  Uploader(DevicePool& pool, ActDType act, GpuStream stream) : pool_(pool), act_(act), stream_(stream) {}

  absl::StatusOr<const float*> Vector(const std::vector<float>& v) {
    if (v.empty()) return nullptr;
    ASSIGN_OR_RETURN(void* p, pool_.Upload(v.data(), v.size() * sizeof(float), stream_));
    return static_cast<const float*>(p);
  }

  // The view's stored rows (and NVFP4 scales) copied as they are; the view re-pointed.
  absl::StatusOr<WeightRef> Stored(const WeightRef& w) {
    if (!w.valid()) return WeightRef{};
    WeightRef d = w;
    ASSIGN_OR_RETURN(void* data, pool_.Upload(w.data, static_cast<size_t>(w.rows * w.row_stride_bytes), stream_));
    d.data = static_cast<const uint8_t*>(data);
    if (w.scale) {
      ASSIGN_OR_RETURN(void* sc, pool_.Upload(w.scale, static_cast<size_t>(w.rows * w.scale_row_stride), stream_));
      d.scale = static_cast<const uint8_t*>(sc);
    }
    return d;
  }

  // The view expanded on the device into a contiguous [rows, cols] matrix of `dt`. The
  // stored bytes pass through a temporary buffer.
  absl::StatusOr<DenseWeight> Dense(const WeightRef& w, ActDType dt) {
    if (!w.valid()) return DenseWeight{};
    DevicePool tmp(/*chunk_bytes=*/0);  // exact sizes: freed right after the expansion
    Uploader up(tmp, dt, stream_);
    ASSIGN_OR_RETURN(WeightRef dw, up.Stored(w));
    if (w.format == WeightFormat::kQ8_0 && KeepDenseQ8(dt) && w.cols % 32 == 0 && w.col_offset % 32 == 0) {
      ASSIGN_OR_RETURN(DenseWeight d, SplitQ8Dense(dw, pool_, dt, stream_));
      MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // before tmp is freed
      return d;
    }
    const size_t elem = dt == ActDType::kF32 ? 4 : 2;
    ASSIGN_OR_RETURN(void* out, pool_.Alloc(static_cast<size_t>(w.rows * w.cols) * elem));
    ExpandParams p;
    p.w = dw;
    p.out = out;
    p.out_dtype = dt;
    // ExpandWeights launches one grid row per weight row, up to 65535 rows at a time.
    for (int64_t r0 = 0; r0 < w.rows; r0 += 65535) {
      ExpandParams part = p;
      part.w = dw.RowSlice(r0, std::min<int64_t>(65535, w.rows - r0));
      part.out = static_cast<char*>(out) + static_cast<size_t>(r0 * w.cols) * elem;
      RETURN_IF_ERROR(ExpandWeights(part, stream_));
    }
    MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // before tmp is freed
    return DenseWeight{out, dt, w.rows, w.cols};
  }
  absl::StatusOr<DenseWeight> Dense(const WeightRef& w) { return Dense(w, act_); }

 private:
  DevicePool& pool_;
  ActDType act_;
  GpuStream stream_;
};

}  // namespace

bool KeepDenseQ8(ActDType act) {
  static const bool on = [] {
    const char* v = std::getenv("MOESHARD_DENSE_Q8");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on && act == ActDType::kBF16;
}

absl::StatusOr<DenseWeight> SplitQ8Dense(const WeightRef& q8_dev, DevicePool& pool, ActDType act, GpuStream stream) {
  ASSIGN_OR_RETURN(void* codes, pool.Alloc(static_cast<size_t>(q8_dev.rows * q8_dev.cols)));
  ASSIGN_OR_RETURN(void* scales, pool.Alloc(static_cast<size_t>(q8_dev.rows * (q8_dev.cols / 32)) * 2));
  RETURN_IF_ERROR(GemvSplitQ8(q8_dev, static_cast<int8_t*>(codes), static_cast<uint16_t*>(scales), stream));
  DenseWeight d{codes, act, q8_dev.rows, q8_dev.cols};
  d.q8_scales = static_cast<const uint16_t*>(scales);
  return d;
}

absl::Status AllocGemmScratch(GpuModelWeights* g, ActDType act) {
  size_t most = 0;
  const size_t elem = act == ActDType::kF32 ? 4 : 2;
  auto see = [&](const DenseWeight& w) {
    if (w.q8_scales) most = std::max(most, static_cast<size_t>(w.rows * w.cols) * elem);
  };
  see(g->lm_head);
  for (const GpuLayerWeights& l : g->layers) {
    for (const DenseWeight* w : {&l.q, &l.k, &l.v, &l.o, &l.head_gate, &l.latent_in, &l.latent_out, &l.dense.gate,
                                 &l.dense.up, &l.dense.down}) {
      see(*w);
    }
  }
  if (most == 0) return absl::OkStatus();
  g->gemm_scratch_bytes = std::min<size_t>(most, size_t{64} << 20);
  ASSIGN_OR_RETURN(g->gemm_scratch, g->pool.Alloc(g->gemm_scratch_bytes));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GpuModelWeights>> UploadModelWeights(const ModelWeights& w, ActDType act,
                                                                    GpuStream stream, RepackPolicy repack) {
  auto g = std::make_unique<GpuModelWeights>();
  Uploader up(g->pool, act, stream);
  ASSIGN_OR_RETURN(g->embed, up.Stored(w.embed));
  ASSIGN_OR_RETURN(g->lm_head, up.Dense(w.lm_head));
  ASSIGN_OR_RETURN(g->final_norm, up.Vector(w.final_norm));
  for (const LayerWeights& lw : w.layers) {
    GpuLayerWeights l;
    ASSIGN_OR_RETURN(l.attn_norm, up.Vector(lw.attn_norm));
    ASSIGN_OR_RETURN(l.q_norm, up.Vector(lw.q_norm));
    ASSIGN_OR_RETURN(l.k_norm, up.Vector(lw.k_norm));
    ASSIGN_OR_RETURN(l.attn_out_norm, up.Vector(lw.attn_out_norm));
    ASSIGN_OR_RETURN(l.attn_alpha, up.Vector(lw.attn_alpha));
    ASSIGN_OR_RETURN(l.attn_beta, up.Vector(lw.attn_beta));
    ASSIGN_OR_RETURN(l.q, up.Dense(lw.q));
    ASSIGN_OR_RETURN(l.k, up.Dense(lw.k));
    ASSIGN_OR_RETURN(l.v, up.Dense(lw.v));
    ASSIGN_OR_RETURN(l.o, up.Dense(lw.o));
    ASSIGN_OR_RETURN(l.head_gate, up.Dense(lw.head_gate));
    ASSIGN_OR_RETURN(l.q_bias, up.Vector(lw.q_bias));
    ASSIGN_OR_RETURN(l.k_bias, up.Vector(lw.k_bias));
    ASSIGN_OR_RETURN(l.v_bias, up.Vector(lw.v_bias));
    ASSIGN_OR_RETURN(l.o_bias, up.Vector(lw.o_bias));
    ASSIGN_OR_RETURN(l.moe_norm, up.Vector(lw.moe_norm));
    ASSIGN_OR_RETURN(l.moe_out_norm, up.Vector(lw.moe_out_norm));
    ASSIGN_OR_RETURN(l.moe_alpha, up.Vector(lw.moe_alpha));
    ASSIGN_OR_RETURN(l.moe_beta, up.Vector(lw.moe_beta));
    ASSIGN_OR_RETURN(l.router, up.Dense(lw.router, ActDType::kF32));
    ASSIGN_OR_RETURN(l.latent_in, up.Dense(lw.latent_in));
    ASSIGN_OR_RETURN(l.latent_out, up.Dense(lw.latent_out));
    ASSIGN_OR_RETURN(l.dense.gate, up.Dense(lw.dense.gate));
    ASSIGN_OR_RETURN(l.dense.up, up.Dense(lw.dense.up));
    ASSIGN_OR_RETURN(l.dense.down, up.Dense(lw.dense.down));
    if (!lw.experts.empty()) {
      const int64_t width = lw.experts[0].gate.cols, inter = lw.experts[0].gate.rows;
      std::vector<MoeExpertWeights> ex(lw.experts.size());
      auto upload = [&](Uploader& u) -> absl::Status {
        for (size_t e = 0; e < lw.experts.size(); ++e) {
          ASSIGN_OR_RETURN(ex[e].gate, u.Stored(lw.experts[e].gate));
          ASSIGN_OR_RETURN(ex[e].up, u.Stored(lw.experts[e].up));
          ASSIGN_OR_RETURN(ex[e].down, u.Stored(lw.experts[e].down));
        }
        return absl::OkStatus();
      };
      uint32_t repacked = 0;  // the hint bits of a repacked layer
      std::string why;
      if (MayRepackExperts(lw.experts[0].gate.format, width, inter, act, repack)) {
        // NVFP4 experts pass through a temporary buffer into the streaming kernels' layout.
        DevicePool tmp(/*chunk_bytes=*/0);
        Uploader tu(tmp, act, stream);
        RETURN_IF_ERROR(upload(tu));
        ASSIGN_OR_RETURN(const bool want, WantRepackExperts(ex, width, inter, act, repack, stream, &why));
        if (want) {
          ASSIGN_OR_RETURN(repacked, RepackExperts(ex, g->pool, stream));
        }
        MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // before tmp is freed
      } else {
        why = RepackRefusal(lw.experts[0].gate.format, width, inter, act, repack);
      }
      g->experts_stored_why.push_back(repacked ? "" : why);
      if (!repacked) RETURN_IF_ERROR(upload(up));
      ASSIGN_OR_RETURN(void* arr, g->pool.Upload(ex.data(), ex.size() * sizeof(MoeExpertWeights), stream));
      l.experts = static_cast<const MoeExpertWeights*>(arr);
      l.expert_formats = MoeExpertFormats(ex.data(), static_cast<int>(ex.size()), width, inter);
      l.expert_formats |= repacked;
    }
    g->layers.push_back(l);
  }
  RETURN_IF_ERROR(AllocGemmScratch(g.get(), act));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return g;
}

}  // namespace moeshard::gpu
