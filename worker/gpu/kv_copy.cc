// The FP8 prefill path of the GPU runner. Over an FP8 cache the tensor-core prefill kernel would
// convert every FP8 tile to bf16 in shared memory before its mmas — as many instructions again
// as the mmas, so a 128K-token prefill took 81 s with FP8 KV against 40 s with bf16. Instead, once
// per prefill step the runner plans which blocks each chunk's queries can see
// (worker/kv_copy_plan.h; the window's blocks for sliding-window layers), and each layer's
// Attention dequantizes exactly those blocks into a bf16 copy (kernels/cuda/kv_dequant.cu, ~0.1 ms
// a layer for a 128K context) and runs the bf16 kernels on it through the plan's tables (the wgmma
// prefill kernel on Hopper). The copy's values are the ones the tensor-core kernel's FP8 tiles
// would hold (model_ops_test checks that kernel bit for bit over the copy).
#include <algorithm>

#include "worker/gpu/gpu_model_runner_impl.h"
#include "worker/kv_copy_plan.h"

namespace moeshard::gpu_runner {

namespace {
size_t RoundUp(size_t n) { return (n + 255) / 256 * 256; }
}  // namespace

absl::Status GpuModelRunner::PrepareKvCopy(const std::vector<SeqChunk>& batch) {
  kv_copy_active_ = false;
  const int64_t hd = config_.head_dim, bs = options_.block_size;
  // Only a prefill step (one-token steps take the split-decode kernels, which read FP8 at their
  // own pace) on bf16 activations, whose attention is a bf16 tensor-core kernel.
  if (kv_copy_cap_mb_ <= 0 || kv_elem_ != KvElem::kFp8E4M3 || act_ != ActDType::kBF16 || max_chunk_tokens_ <= 8 ||
      hd > 128 || hd % 8 != 0 || kv_.empty()) {
    return absl::OkStatus();
  }
  bool any_full = false, any_window = false;
  for (int64_t li = shard_.layer_begin; li < shard_.layer_end; ++li) {
    (config_.layers[li].sliding && config_.sliding_window > 0 ? any_window : any_full) = true;
  }
  KvCopyPlan plans[2];
  if (any_full) {
    ASSIGN_OR_RETURN(plans[0], PlanKvCopy(batch, bs, 0, false));
  }
  if (any_window) {
    ASSIGN_OR_RETURN(plans[1], PlanKvCopy(batch, bs, config_.sliding_window, sliding_pool()));
  }
  const size_t blocks = std::max(plans[0].src_blocks.size(), plans[1].src_blocks.size());
  const size_t copy_bytes = RoundUp(blocks * static_cast<size_t>(bs * nkv_ * hd) * 2);  // K or V, bf16
  if (blocks == 0 || 2 * copy_bytes > (static_cast<size_t>(kv_copy_cap_mb_) << 20)) return absl::OkStatus();

  kv_copy_host_.clear();
  size_t at[2][3];  // int offsets of each plan's src, tables, toff
  for (int k = 0; k < 2; ++k) {
    const std::vector<int32_t>* parts[3] = {&plans[k].src_blocks, &plans[k].tables, &plans[k].table_offset};
    for (int j = 0; j < 3; ++j) {
      at[k][j] = kv_copy_host_.size();
      kv_copy_host_.insert(kv_copy_host_.end(), parts[j]->begin(), parts[j]->end());
    }
  }
  const size_t int_bytes = RoundUp(kv_copy_host_.size() * 4);
  const size_t need = int_bytes + 2 * copy_bytes;
  if (kv_copy_buf_.bytes() < need) {
    const size_t grown = std::max(need, kv_copy_buf_.bytes() + kv_copy_buf_.bytes() / 4);
    kv_copy_buf_ = DeviceBuffer();  // free the old one first (cudaFree waits for its readers)
    ASSIGN_OR_RETURN(kv_copy_buf_, DeviceBuffer::Allocate(grown));
  }
  auto* base = static_cast<uint8_t*>(kv_copy_buf_.get());
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(base, kv_copy_host_.data(), kv_copy_host_.size() * 4,
                                                cudaMemcpyHostToDevice, stream_));
  auto* ints = reinterpret_cast<int32_t*>(base);
  for (int k = 0; k < 2; ++k) {
    kv_copy_[k] = {ints + at[k][0], ints + at[k][1], ints + at[k][2], static_cast<int64_t>(plans[k].src_blocks.size())};
  }
  kv_copy_k_ = base + int_bytes;
  kv_copy_v_ = base + int_bytes + copy_bytes;
  kv_copy_active_ = true;
  return absl::OkStatus();
}

absl::Status GpuModelRunner::UseKvCopy(int64_t li, AttentionParams* ap) {
  const bool window = config_.layers[shard_.layer_begin + li].sliding && config_.sliding_window > 0;
  const KvCopyDevice& d = kv_copy_[window ? 1 : 0];
  if (d.blocks == 0) return absl::OkStatus();
  KvDequantParams kp;
  kp.src = kv_[li];
  kp.src_blocks = d.src;
  kp.num_blocks = d.blocks;
  kp.k_out = kv_copy_k_;
  kp.v_out = kv_copy_v_;
  RETURN_IF_ERROR(gpu::KvDequant(kp, stream_));
  KvCacheView copy;
  copy.k = kv_copy_k_;
  copy.v = kv_copy_v_;
  copy.elem = KvElem::kBF16;
  copy.block_size = options_.block_size;
  copy.num_kv_heads = nkv_;
  copy.head_dim = config_.head_dim;
  copy.num_blocks = d.blocks;  // the tables point only at copied blocks (and the wgmma kernel's boxes need the count)
  ap->cache = copy;
  ap->block_tables = d.tables;
  ap->table_offset = d.toff;
  return absl::OkStatus();
}

}  // namespace moeshard::gpu_runner
