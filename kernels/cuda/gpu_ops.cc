// Validation of the kernel params, then the launch, with CUDA errors as statuses.
#include "kernels/cuda/gpu_ops.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launchers.h"

namespace moeshard::gpu {
namespace {

constexpr int64_t kMaxGridY = 65535;
// kAuto's choice of the tensor-core attention kernel for bf16 batches.
constexpr bool kTensorCoreByDefault = true;

absl::Status CheckWeight(const WeightRef& w) {
  if (!w.valid()) return absl::InvalidArgumentError("weight view is empty or has no data");
  if (w.row_stride_bytes <= 0 || w.col_offset < 0) {
    return absl::InvalidArgumentError("weight view needs a positive row stride and offset >= 0");
  }
  if (w.format == WeightFormat::kNVFP4 && (w.scale == nullptr || w.scale_row_stride <= 0)) {
    return absl::InvalidArgumentError("nvfp4 weights need block scales");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ExpandWeights(const ExpandParams& p, GpuStream stream) {
  if (absl::Status s = CheckWeight(p.w); !s.ok()) return s;
  if (p.out == nullptr) return absl::InvalidArgumentError("ExpandWeights: no output");
  if (p.w.rows > kMaxGridY) {
    return absl::InvalidArgumentError(absl::StrCat("ExpandWeights: more than ", kMaxGridY, " rows"));
  }
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchExpand(p, stream));
  return absl::OkStatus();
}

absl::Status MatMul(const MatMulParams& p, GpuStream stream) {
  if (absl::Status s = CheckWeight(p.w); !s.ok()) return s;
  if (p.num_tokens <= 0) return absl::OkStatus();
  if (p.x == nullptr || p.y == nullptr) return absl::InvalidArgumentError("MatMul: no x or y");
  if (p.num_tokens > 32 * kMaxGridY) {
    return absl::InvalidArgumentError(absl::StrCat("MatMul: too many tokens: ", p.num_tokens));
  }
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchMatMul(p, stream));
  return absl::OkStatus();
}

absl::Status Embed(const EmbedParams& p, GpuStream stream) {
  if (absl::Status s = CheckWeight(p.w); !s.ok()) return s;
  if (p.num_tokens <= 0) return absl::OkStatus();
  if (!p.ids || !p.out) return absl::InvalidArgumentError("Embed: no ids or output");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchEmbed(p, stream));
  return absl::OkStatus();
}

absl::Status RmsNorm(const RmsNormParams& p, GpuStream stream) {
  if (p.rows <= 0) return absl::OkStatus();
  if (!p.x || !p.out || p.dim <= 0) return absl::InvalidArgumentError("RmsNorm: no input, output or width");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchRmsNorm(p, stream));
  return absl::OkStatus();
}

absl::Status Residual(const ResidualParams& p, GpuStream stream) {
  if (p.rows <= 0) return absl::OkStatus();
  const bool mixed = p.mix_rows != nullptr;
  if (!p.s || (!p.out && !mixed) || p.dim <= 0) return absl::InvalidArgumentError("Residual: no stream, output or width");
  if (mixed && (!p.mix_pos || !p.mix_weights || p.mix_k <= 0 || p.mix_k > 64)) {
    return absl::InvalidArgumentError("Residual: mixed rows need positions, weights and 1..64 slots");
  }
  if (p.gated && (!p.out_norm || !p.alpha || !p.beta)) {
    return absl::InvalidArgumentError("Residual: the gated form needs out_norm, alpha and beta");
  }
  if (p.gated && p.pre_add) return absl::InvalidArgumentError("Residual: pre_add is for the plain form only");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchResidual(p, stream));
  return absl::OkStatus();
}

absl::Status Rope(const RopeParams& p, GpuStream stream) {
  if (p.num_tokens <= 0) return absl::OkStatus();
  if (!p.x || !p.pos || p.head_dim <= 0 || p.head_dim % 2 || p.head_dim > 8192) {
    return absl::InvalidArgumentError("Rope: no input or positions, or a head_dim that is odd or above 8192");
  }
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchRope(p, stream));
  return absl::OkStatus();
}

static absl::Status CheckCache(const KvCacheView& c) {
  if (!c.k || !c.v || c.block_size <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0) {
    return absl::InvalidArgumentError("KV cache view is incomplete");
  }
  if (c.elem == KvElem::kFp8E4M3 && (!c.k_scale || !c.v_scale)) {
    return absl::InvalidArgumentError("FP8 KV cache needs scale arrays");
  }
  if (c.head_dim > MaxAttentionHeadDim()) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", c.head_dim, " exceeds ", MaxAttentionHeadDim()));
  }
  return absl::OkStatus();
}

absl::Status KvWrite(const KvWriteParams& p, GpuStream stream) {
  if (p.num_tokens <= 0) return absl::OkStatus();
  if (absl::Status s = CheckCache(p.cache); !s.ok()) return s;
  if (!p.k || !p.v || !p.slots) return absl::InvalidArgumentError("KvWrite: no k, v or slots");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchKvWrite(p, stream));
  return absl::OkStatus();
}

absl::Status KvDequant(const KvDequantParams& p, GpuStream stream) {
  if (p.num_blocks <= 0) return absl::OkStatus();
  if (absl::Status s = CheckCache(p.src); !s.ok()) return s;
  if (p.src.elem != KvElem::kFp8E4M3 || !p.src.k_scale || !p.src.v_scale) {
    return absl::InvalidArgumentError("KvDequant: the source must be an FP8 cache with its scales");
  }
  if (p.src.head_dim % 8 != 0) return absl::InvalidArgumentError("KvDequant: head_dim must be a multiple of 8");
  if (!p.src_blocks || !p.k_out || !p.v_out) return absl::InvalidArgumentError("KvDequant: missing blocks or outputs");
  if (p.num_blocks > 0x7fffffff) return absl::InvalidArgumentError("KvDequant: too many blocks");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchKvDequant(p, stream));
  return absl::OkStatus();
}

bool QkPrepSupports(int64_t head_dim) { return head_dim > 0 && head_dim % 64 == 0 && head_dim <= 256; }

bool AttentionDecodeFusedSupports(const AttentionParams& p, const QkPrepParams& prep) {
  return p.num_tokens > 0 && prep.num_tokens == p.num_tokens && prep.num_heads == p.num_heads &&
         DecodeFusedSupports(p, prep);
}

absl::Status AttentionDecodeFused(const AttentionParams& p, const QkPrepParams& prep, GpuStream stream) {
  if (p.num_tokens <= 0) return absl::OkStatus();
  if (absl::Status s = CheckCache(p.cache); !s.ok()) return s;
  if (!p.q || !p.out || !p.pos || !p.block_tables || !p.table_offset) {
    return absl::InvalidArgumentError("AttentionDecodeFused: missing buffers");
  }
  if (!AttentionDecodeFusedSupports(p, prep)) return absl::InvalidArgumentError("AttentionDecodeFused: unsupported shape");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchAttentionDecodeFused(p, prep, stream));
  return absl::OkStatus();
}

absl::Status QkPrep(const QkPrepParams& p, GpuStream stream) {
  if (p.num_tokens <= 0) return absl::OkStatus();
  if (absl::Status s = CheckCache(p.cache); !s.ok()) return s;
  if (!QkPrepSupports(p.cache.head_dim)) return absl::InvalidArgumentError("QkPrep: head_dim must be 64, 128, 192 or 256");
  if (!p.q || !p.k || !p.v || !p.slots || (p.rope && !p.pos)) {
    return absl::InvalidArgumentError("QkPrep: missing q, k, v, slots or positions");
  }
  if ((p.q_norm == nullptr) != (p.k_norm == nullptr)) return absl::InvalidArgumentError("QkPrep: q_norm and k_norm go together");
  if (p.num_heads <= 0 || p.num_tokens > 0x7fffffff) return absl::InvalidArgumentError("QkPrep: bad head or token count");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchQkPrep(p, stream));
  return absl::OkStatus();
}

absl::Status Attention(const AttentionParams& p, GpuStream stream) {
  if (p.num_tokens <= 0) return absl::OkStatus();
  if (absl::Status s = CheckCache(p.cache); !s.ok()) return s;
  if (!p.q || !p.out || !p.pos || !p.table_offset || !p.block_tables) {
    return absl::InvalidArgumentError("Attention: missing q, out, positions or block tables");
  }
  if (p.num_heads <= 0 || p.num_heads % p.cache.num_kv_heads) {
    return absl::InvalidArgumentError("Attention: query heads must be a multiple of KV heads");
  }
  if (p.num_heads > kMaxGridY) return absl::InvalidArgumentError("Attention: too many heads");
  absl::StatusOr<AttentionAlgo> algo = ResolveAttentionAlgo(p);
  if (!algo.ok()) return algo.status();
  if (p.workspace_bytes < 0 || (p.workspace_bytes > 0 && !p.workspace)) {
    return absl::InvalidArgumentError("Attention: workspace_bytes without a workspace");
  }
  AttentionParams q = p;
  q.algo = *algo;
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchAttention(q, stream));
  return absl::OkStatus();
}

int64_t AttentionWorkspaceBytes(int64_t num_tokens, int64_t num_heads, int64_t head_dim, int64_t max_splits) {
  const int64_t s = std::max<int64_t>(1, std::min<int64_t>(max_splits, MaxAttentionSplits()));
  return std::max<int64_t>(0, num_tokens) * num_heads * s * (head_dim + 2) * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<AttentionAlgo> ResolveAttentionAlgo(const AttentionParams& p) {
  const KvCacheView& c = p.cache;
  const int64_t group = c.num_kv_heads > 0 ? p.num_heads / c.num_kv_heads : 0;
  const bool aligned = reinterpret_cast<uintptr_t>(c.k) % 16 == 0 && reinterpret_cast<uintptr_t>(c.v) % 16 == 0;
  const bool tiled = c.head_dim % 4 == 0 && c.head_dim <= 256 && group >= 1 && group <= 64 && aligned;
  const bool decode = tiled && group <= MaxSplitDecodeGroup() && p.num_tokens <= kMaxGridY;
  const bool tensor_core = tiled && p.dtype == ActDType::kBF16 && c.head_dim <= 128;
  switch (p.algo) {
    case AttentionAlgo::kReference: return AttentionAlgo::kReference;
    case AttentionAlgo::kTiled:
      if (!tiled) return absl::InvalidArgumentError("Attention: the tiled kernel cannot run this shape");
      return AttentionAlgo::kTiled;
    case AttentionAlgo::kSplitDecode:
      if (!decode) return absl::InvalidArgumentError("Attention: the split-decode kernel cannot run this shape");
      return AttentionAlgo::kSplitDecode;
    case AttentionAlgo::kTiledTensorCore:
      if (!tensor_core) {
        return absl::InvalidArgumentError("Attention: the tensor-core kernel needs bf16 activations, head_dim <= 128");
      }
      return AttentionAlgo::kTiledTensorCore;
    case AttentionAlgo::kWgmma:
      if (!tiled || !WgmmaAttentionSupports(p)) {
        return absl::InvalidArgumentError(
            "Attention: the wgmma kernel needs an sm_90 device, bf16 activations and cache, head_dim 64 or 128 and "
            "query heads per KV head dividing 128");
      }
      return AttentionAlgo::kWgmma;
    case AttentionAlgo::kAuto: break;
  }
  const int64_t q_len = p.max_tokens_per_seq > 0 ? p.max_tokens_per_seq : p.num_tokens;
  if (decode && q_len <= 8) return AttentionAlgo::kSplitDecode;
  if (tiled && WgmmaAttentionSupports(p)) return AttentionAlgo::kWgmma;
  if (tensor_core && kTensorCoreByDefault) return AttentionAlgo::kTiledTensorCore;
  if (tiled) return AttentionAlgo::kTiled;
  return AttentionAlgo::kReference;
}

absl::Status Routing(const RoutingParams& p, GpuStream stream) {
  if (p.num_tokens <= 0) return absl::OkStatus();
  if (!p.logits || !p.local_ids || !p.weights) return absl::InvalidArgumentError("Routing: missing buffers");
  if (p.top_k <= 0 || p.top_k > p.num_experts || p.top_k > MaxRoutingTopK()) {
    return absl::InvalidArgumentError(absl::StrCat("Routing: top_k ", p.top_k, " outside [1, min(", p.num_experts,
                                                   ", ", MaxRoutingTopK(), ")]"));
  }
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchRouting(p, stream));
  return absl::OkStatus();
}

absl::Status SiluMul(const SiluMulParams& p, GpuStream stream) {
  if (p.n <= 0) return absl::OkStatus();
  if (!p.gate || !p.up || !p.out) return absl::InvalidArgumentError("SiluMul: missing buffers");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchSiluMul(p, stream));
  return absl::OkStatus();
}

absl::Status HeadGate(const HeadGateParams& p, GpuStream stream) {
  if (p.num_tokens <= 0) return absl::OkStatus();
  if (!p.o || !p.gate || p.head_dim <= 0) return absl::InvalidArgumentError("HeadGate: missing buffers");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchHeadGate(p, stream));
  return absl::OkStatus();
}

absl::Status AddBias(const AddBiasParams& p, GpuStream stream) {
  if (p.rows <= 0 || p.bias == nullptr) return absl::OkStatus();
  if (!p.y || p.cols <= 0) return absl::InvalidArgumentError("AddBias: missing buffers");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchAddBias(p, stream));
  return absl::OkStatus();
}

int64_t ArgMaxBytes(int64_t rows) { return ArgMaxScratchBytes(rows); }

absl::Status ArgMax(const ArgMaxParams& p, GpuStream stream) {
  if (p.rows <= 0) return absl::OkStatus();
  if (!p.logits || !p.partial_value || !p.partial_index || !p.out || p.vocab <= 0) {
    return absl::InvalidArgumentError("ArgMax: missing buffers");
  }
  if (p.rows > 65535) return absl::InvalidArgumentError("ArgMax: more than 65,535 rows");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchArgMax(p, stream));
  return absl::OkStatus();
}

absl::Status Convert(const ConvertParams& p, GpuStream stream) {
  if (p.n <= 0) return absl::OkStatus();
  if (!p.x || !p.y) return absl::InvalidArgumentError("Convert: missing buffers");
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchConvert(p, stream));
  return absl::OkStatus();
}

absl::Status Fill(const FillParams& p, GpuStream stream) {
  if (p.count <= 0) return absl::OkStatus();
  if (!p.dst) return absl::InvalidArgumentError("Fill: no destination");
  if ((p.kind == FillKind::kStridedU16 && p.stride < 2) || (p.kind == FillKind::kStridedU8 && p.stride < 1)) {
    return absl::InvalidArgumentError("Fill: the strided kinds need a stride");
  }
  MOESHARD_CUDA_RETURN_IF_ERROR(LaunchFill(p, stream));
  return absl::OkStatus();
}

}  // namespace moeshard::gpu
