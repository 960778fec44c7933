#include "worker/gpu/random_weights.h"

#include <cuda_runtime.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gpu_ops.h"
#include "worker/gpu/expert_repack.h"

namespace moeshard::gpu {
namespace {

constexpr float kE2M1Rms = 2.926f;  // rms of the E2M1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}

class Maker {
 public:
  Maker(DevicePool& pool, ActDType act, uint64_t seed, GpuStream stream, bool dense_q8 = false)
      : pool_(pool), act_(act), seed_(seed), stream_(stream), dense_q8_(dense_q8) {}

  absl::StatusOr<const float*> Ones(int64_t n) { return Const(n, 1.f); }
  absl::StatusOr<const float*> Const(int64_t n, float v) {
    ASSIGN_OR_RETURN(void* p, pool_.Alloc(n * 4));
    RETURN_IF_ERROR(Fill({p, n, FillKind::kConstF32, v}, stream_));
    return static_cast<const float*>(p);
  }
  absl::StatusOr<DenseWeight> Dense(int64_t rows, int64_t cols, ActDType dt) {
    const size_t elem = dt == ActDType::kF32 ? 4 : 2;
    ASSIGN_OR_RETURN(void* p, pool_.Alloc(rows * cols * elem));
    const float a = std::sqrt(3.f / static_cast<float>(cols));
    FillParams f{p, rows * cols, dt == ActDType::kF32 ? FillKind::kUniformF32 : FillKind::kUniformBf16, a, ++seed_};
    RETURN_IF_ERROR(Fill(f, stream_));
    return DenseWeight{p, dt, rows, cols};
  }
  // Activation-dtype matrices are split Q8 when dense_q8 (random Q8_0 codes, as a file's).
  absl::StatusOr<DenseWeight> Dense(int64_t rows, int64_t cols) {
    if (!dense_q8_ || cols % 32 != 0) return Dense(rows, cols, act_);
    DevicePool tmp(/*chunk_bytes=*/0);
    Maker tmk(tmp, act_, ++seed_, stream_);
    ASSIGN_OR_RETURN(WeightRef q8, tmk.Stored(WeightFormat::kQ8_0, rows, cols));
    ASSIGN_OR_RETURN(DenseWeight d, SplitQ8Dense(q8, pool_, act_, stream_));
    MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));  // before tmp is freed
    return d;
  }

  // [rows, cols] in `f`, contiguous rows, device pointers.
  absl::StatusOr<WeightRef> Stored(WeightFormat f, int64_t rows, int64_t cols) {
    WeightRef w;
    w.format = f;
    w.rows = rows;
    w.cols = cols;
    w.row_stride_bytes = WeightRowBytes(f, cols);
    const int64_t bytes = rows * w.row_stride_bytes;
    ASSIGN_OR_RETURN(void* p, pool_.Alloc(bytes));
    w.data = static_cast<const uint8_t*>(p);
    const float sd = 1.f / std::sqrt(static_cast<float>(cols));
    switch (f) {
      case WeightFormat::kBF16:
        RETURN_IF_ERROR(Fill({p, rows * cols, FillKind::kUniformBf16, std::sqrt(3.f) * sd, ++seed_}, stream_));
        break;
      case WeightFormat::kQ8_0: {  // q uniform in [-128, 127]: rms ~ 73.9
        RETURN_IF_ERROR(Fill({p, bytes, FillKind::kRandomBytes, 1.f, ++seed_}, stream_));
        const uint16_t d = F32ToF16(sd / 73.9f);
        RETURN_IF_ERROR(Fill({p, bytes / 34, FillKind::kStridedU16, 1.f, 0, 34, d}, stream_));
        break;
      }
      case WeightFormat::kMXFP4: {
        RETURN_IF_ERROR(Fill({p, bytes, FillKind::kRandomBytes, 1.f, ++seed_}, stream_));
        const int e = static_cast<int>(std::lround(std::log2(sd / kE2M1Rms)));
        RETURN_IF_ERROR(Fill({p, bytes / 17, FillKind::kStridedU8, 1.f, 0, 17, static_cast<uint32_t>(127 + e)}, stream_));
        break;
      }
      case WeightFormat::kNVFP4: {
        RETURN_IF_ERROR(Fill({p, bytes, FillKind::kRandomBytes, 1.f, ++seed_}, stream_));
        w.scale_row_stride = cols / 16;
        ASSIGN_OR_RETURN(void* s, pool_.Alloc(rows * w.scale_row_stride));
        MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(s, F32ToE4M3(1.f), rows * w.scale_row_stride, stream_));
        w.scale = static_cast<const uint8_t*>(s);
        w.scale2 = sd / kE2M1Rms;
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("random experts in ", WeightFormatName(f), " are not supported (bf16, q8_0, mxfp4, nvfp4)"));
    }
    return w;
  }

 private:
  DevicePool& pool_;
  ActDType act_;
  uint64_t seed_;
  GpuStream stream_;
  bool dense_q8_;
};

}  // namespace

absl::StatusOr<std::pair<std::unique_ptr<ModelWeights>, std::unique_ptr<GpuModelWeights>>> RandomModelWeights(
    const ModelConfig& c, const ShardSpec& shard, ActDType act, WeightFormat ef, uint64_t seed, GpuStream stream,
    WeightFormat dense_format, RepackPolicy repack) {
  RETURN_IF_ERROR(ValidateShard(c, shard));
  if ((ef == WeightFormat::kQ8_0 || ef == WeightFormat::kMXFP4 || ef == WeightFormat::kNVFP4) &&
      (c.expert_width() % 32 || c.expert_intermediate % 32)) {
    return absl::InvalidArgumentError("block-quantized experts need widths that are multiples of 32");
  }
  auto meta = std::make_unique<ModelWeights>();
  auto g = std::make_unique<GpuModelWeights>();
  const int64_t tp = shard.tp_size, H = c.hidden_size, hd = c.head_dim, V = c.vocab_size, Lw = c.expert_width();
  meta->num_local_heads = c.num_heads / tp;
  meta->num_local_kv_heads = c.num_kv_heads / tp;
  meta->num_local_experts = c.num_experts / tp;
  meta->expert_begin = shard.tp_rank * meta->num_local_experts;
  meta->local_dense_intermediate = c.dense_intermediate / tp;
  const int64_t nq = meta->num_local_heads, nkv = meta->num_local_kv_heads;
  if (dense_format != WeightFormat::kBF16 && dense_format != WeightFormat::kQ8_0) {
    return absl::InvalidArgumentError("random dense matrices are bf16 (the activation dtype) or q8_0");
  }
  Maker mk(g->pool, act, seed, stream, dense_format == WeightFormat::kQ8_0 && KeepDenseQ8(act));
  if (shard.first_stage) {
    ASSIGN_OR_RETURN(g->embed, mk.Stored(WeightFormat::kBF16, V, H));
  }
  if (shard.last_stage) {
    ASSIGN_OR_RETURN(g->final_norm, mk.Ones(H));
    ASSIGN_OR_RETURN(g->lm_head, mk.Dense(V, H));
  }
  meta->layers.resize(shard.layer_end - shard.layer_begin);
  for (int64_t li = shard.layer_begin; li < shard.layer_end; ++li) {
    const LayerSpec& spec = c.layers[li];
    GpuLayerWeights l;
    ASSIGN_OR_RETURN(l.attn_norm, mk.Ones(H));
    ASSIGN_OR_RETURN(l.moe_norm, mk.Ones(H));
    ASSIGN_OR_RETURN(l.q, mk.Dense(nq * hd, H));
    ASSIGN_OR_RETURN(l.k, mk.Dense(nkv * hd, H));
    ASSIGN_OR_RETURN(l.v, mk.Dense(nkv * hd, H));
    ASSIGN_OR_RETURN(l.o, mk.Dense(H, nq * hd));
    if (c.qk_norm) {
      ASSIGN_OR_RETURN(l.q_norm, mk.Ones(hd));
      ASSIGN_OR_RETURN(l.k_norm, mk.Ones(hd));
    }
    if (c.attn_output_gate) {
      ASSIGN_OR_RETURN(l.head_gate, mk.Dense(nq, H));
    }
    if (c.gated_residual) {
      for (const float** v : {&l.attn_out_norm, &l.attn_alpha, &l.attn_beta, &l.moe_out_norm, &l.moe_alpha,
                              &l.moe_beta}) {
        ASSIGN_OR_RETURN(*v, mk.Ones(H));
      }
    }
    if (!spec.moe) {
      const int64_t I = meta->local_dense_intermediate;
      ASSIGN_OR_RETURN(l.dense.gate, mk.Dense(I, H));
      ASSIGN_OR_RETURN(l.dense.up, mk.Dense(I, H));
      ASSIGN_OR_RETURN(l.dense.down, mk.Dense(H, I));
    } else {
      ASSIGN_OR_RETURN(l.router, mk.Dense(c.num_experts, H, ActDType::kF32));
      if (c.latent_size > 0) {
        ASSIGN_OR_RETURN(l.latent_in, mk.Dense(Lw, H));
        ASSIGN_OR_RETURN(l.latent_out, mk.Dense(H, Lw));
      }
      std::vector<MoeExpertWeights> ex(meta->num_local_experts);
      auto make = [&](Maker& m) -> absl::Status {
        for (auto& e : ex) {
          ASSIGN_OR_RETURN(e.gate, m.Stored(ef, c.expert_intermediate, Lw));
          ASSIGN_OR_RETURN(e.up, m.Stored(ef, c.expert_intermediate, Lw));
          ASSIGN_OR_RETURN(e.down, m.Stored(ef, Lw, c.expert_intermediate));
        }
        return absl::OkStatus();
      };
      uint32_t repacked = 0;  // the hint bits of a repacked layer
      std::string why;
      if (MayRepackExperts(ef, Lw, c.expert_intermediate, act, repack)) {
        // Made in a temporary buffer, then repacked for the streaming kernels (as at load).
        DevicePool tmp(/*chunk_bytes=*/0);
        Maker tmk(tmp, act, seed * 1000003 + static_cast<uint64_t>(li), stream);
        RETURN_IF_ERROR(make(tmk));
        ASSIGN_OR_RETURN(const bool want, WantRepackExperts(ex, Lw, c.expert_intermediate, act, repack, stream, &why));
        if (want) {
          ASSIGN_OR_RETURN(repacked, RepackExperts(ex, g->pool, stream));
        }
        MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // before tmp is freed
      } else {
        why = RepackRefusal(ef, Lw, c.expert_intermediate, act, repack);
      }
      g->experts_stored_why.push_back(repacked ? "" : why);
      if (!repacked) RETURN_IF_ERROR(make(mk));
      ASSIGN_OR_RETURN(void* arr, g->pool.Upload(ex.data(), ex.size() * sizeof(MoeExpertWeights), stream));
      l.experts = static_cast<const MoeExpertWeights*>(arr);
      l.expert_formats = MoeExpertFormats(ex.data(), static_cast<int>(ex.size()), Lw, c.expert_intermediate);
      l.expert_formats |= repacked;
      MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // `ex` leaves scope
    }
    g->layers.push_back(l);
  }
  RETURN_IF_ERROR(AllocGemmScratch(g.get(), act));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return std::make_pair(std::move(meta), std::move(g));
}

}  // namespace moeshard::gpu
