// The forward pass of one worker's shard, behind one interface with a backend per device:
// CpuModelRunner (float32, the reference; worker/cpu_model_runner.h) and GpuModelRunner
// (CUDA; worker/gpu/), picked by RunnerOptions::device. Embedding (first stage), the
// shard's layers, and the final norm + LM head (last stage). One description of a layer
// (attention + MoE/dense MLP with the architecture's options from ModelConfig) serves every
// supported architecture.
//
// A batch is several sequence chunks laid end to end: chunk i feeds tokens at positions
// start_pos .. start_pos+n-1 and may read the KV cache of positions before start_pos.
// Tensor parallel: each rank computes its heads and experts; partial sums (attention
// output, expert mixture or dense MLP output) are all-reduced in fp32 through `tp_comm`.
// Hidden states cross stage boundaries as host float32 [T, H].
// Not thread-safe: one batch at a time.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/comm/communicator.h"
#include "common/formats/tensor_source.h"
#include "common/model/kv_pools.h"
#include "common/model/model_config.h"
#include "common/model/shard.h"
#include "worker/model/layer_ops.h"

namespace moeshard {

struct SeqChunk {
  std::vector<int32_t> tokens;
  int64_t start_pos = 0;
  std::vector<int32_t> block_table;  // covers [0, start_pos + tokens.size())
  bool all_logits = false;           // logits for every token, else for the last only
  // With a sliding pool (RunnerOptions::num_sliding_kv_blocks > 0): the table the
  // sliding-window layers read and write, in that pool; -1 before the window of start_pos
  // (entries below (start_pos - window + 1) / block_size are never read).
  std::vector<int32_t> sliding_table = {};
};

enum class Device : uint8_t { kCpu, kCuda };
// Activation precision of the GPU backend (the CPU backend is always float32). bf16:
// GEMM inputs and outputs in bf16, fp32 accumulation; residual stream, norms, router,
// softmax and attention scores in fp32. float32: fp32 everywhere, no TF32.
enum class ActPrecision : uint8_t { kFloat32, kBFloat16 };
// KV cache element type (GPU): kAuto = the activation precision.
enum class KvDType : uint8_t { kAuto, kFloat32, kBFloat16, kFp8E4M3 };
// How the GPU backend keeps MoE experts (worker/gpu/expert_repack.h). kAuto: NVFP4 experts
// repacked for the streaming kernels, MXFP4 and Q8_0 as stored (long prompts: the stored blocks'
// prefill GEMMs on wgmma are faster at 4,096 tokens); kStream: MXFP4 and Q8_0 repacked too (decode
// faster at every stream count, H200 2026-12-05: the interactive and throughput deployment);
// kStored: nothing repacked.
enum class ExpertLayout : uint8_t { kAuto, kStream, kStored };

struct RunnerOptions {
  int64_t num_kv_blocks = 256;
  int64_t block_size = 16;
  // > 0, for a model with sliding-window layers: those layers keep their KV in a pool of this
  // many blocks, indexed by SeqChunk::sliding_table (full layers keep num_kv_blocks). 0: every
  // layer in the one pool, indexed by block_table.
  int64_t num_sliding_kv_blocks = 0;
  Device device = Device::kCpu;
  int gpu_index = 0;
  ActPrecision precision = ActPrecision::kBFloat16;
  KvDType kv_dtype = KvDType::kAuto;
  ExpertLayout expert_layout = ExpertLayout::kAuto;
  int64_t max_batch_tokens = 8192;  // GPU: scratch memory is sized for this many tokens per step
  bool profile = false;             // GPU: time each step's regions (ProfileReport, SetProfiling)
};

absl::StatusOr<Device> ParseDevice(const std::string& s);           // cpu | cuda
absl::StatusOr<ActPrecision> ParsePrecision(const std::string& s);  // float32 | bfloat16
absl::StatusOr<KvDType> ParseKvDType(const std::string& s);         // auto | float32 | bfloat16 | fp8
absl::StatusOr<ExpertLayout> ParseExpertLayout(const std::string& s);  // auto | stream | stored

// Checks that a block table covers `num_positions` with block ids below `num_blocks` (from
// table index first_block on: a sliding table's earlier entries are never read).
absl::Status CheckBlockTable(const std::vector<int32_t>& table, int64_t num_positions, int64_t num_blocks,
                             int64_t block_size, int64_t first_block = 0);

// A debugging trace: the residual stream's row at one position after every residual update, so
// that two runs (bf16 against float32, one backend against another) can be compared op by op
// (MOESHARD_TRACE_POSITION=P prints each to stderr; scripts/trace_diff.py compares two logs).
struct ResidualTrace {
  int64_t position = 0;
  int64_t layer = 0;  // the model's layer index
  Block block = Block::kAttention;
  std::vector<float> s;  // [H]
  // MLP blocks of MoE layers, where the runner reports them (the GPU runner): the token's
  // router logits [num_experts] and its picks [top_k] (this rank's local ids, -1 for another's).
  std::vector<float> router_logits;
  std::vector<int32_t> experts;
};
using ResidualTraceSink = std::function<void(const ResidualTrace&)>;

// A hook on the router: at every MoE layer of the step, before the top-k pick, it sees the
// model's layer index, the step's rows' positions [T] and the router's logits [T, num_experts],
// and may change them. The itest's bf16 tolerance uses it to find the float32 engine's near ties
// between the k-th and (k+1)-th expert and to run the model with one decided the other way.
using RouterLogitsHook =
    std::function<void(int64_t layer, const std::vector<int32_t>& positions, int64_t num_experts, float* logits)>;

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  // The backend of options.device. `src` must outlive the runner (the CPU backend's weights
  // are views into it). `tp_comm` may be null when shard.tp_size == 1.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const ModelConfig& config, const TensorSource& src,
                                                             const ShardSpec& shard, const RunnerOptions& options,
                                                             Communicator* tp_comm = nullptr);

  // Checks ids, positions, block tables and the batch size against the model and the cache.
  absl::Status ValidateBatch(const std::vector<SeqChunk>& batch) const;
  // hidden [T_total, H] <- embeddings of all tokens (first stage).
  virtual absl::Status Embed(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) = 0;
  // Runs this shard's layers over hidden in place, writing the KV cache.
  virtual absl::Status RunLayers(const std::vector<SeqChunk>& batch, std::vector<float>* hidden) = 0;
  // logits [rows, V] for the rows each chunk asks for (last stage).
  virtual absl::Status Head(const std::vector<SeqChunk>& batch, const std::vector<float>& hidden,
                            std::vector<float>* logits) = 0;
  // ValidateBatch + Embed + RunLayers + Head (a single-stage shard); backends may keep the
  // hidden state on the device throughout.
  virtual absl::Status Forward(const std::vector<SeqChunk>& batch, std::vector<float>* logits);
  // Forward for a step whose every logits row is drawn greedily with no logprobs: *ids gets each
  // row's ArgMax (worker/sampler.h) and no logits. The GPU finds them on the device and brings
  // back only the ids; the default runs Forward and ArgMax.
  virtual absl::Status ForwardArgMax(const std::vector<SeqChunk>& batch, std::vector<int32_t>* ids);

  const ModelConfig& config() const { return config_; }
  const ShardSpec& shard() const { return shard_; }
  const RunnerOptions& options() const { return options_; }
  int64_t block_size() const { return options_.block_size; }
  // Whether the sliding-window layers have their own pool (and chunks a sliding_table).
  bool sliding_pool() const { return options_.num_sliding_kv_blocks > 0 && HasBothLayerKinds(config_); }
  // Whether layer li of this shard (0-based within it) keeps its KV in the sliding pool.
  bool InSlidingPool(int64_t li) const {
    return sliding_pool() && config_.layers[shard_.layer_begin + li].sliding;
  }
  virtual size_t kv_bytes() const = 0;
  // Per-region device time of the steps since ResetProfile (GPU with options.profile).
  virtual std::string ProfileReport() const { return ""; }
  virtual void ResetProfile() {}
  // Turns the region timing of a runner created with options.profile on or off.
  virtual void SetProfiling(bool on) {}
  virtual std::string backend() const = 0;  // e.g. "cpu float32", "cuda:0 bfloat16"
  // Every residual update of the batch row at `position` (the first chunk that holds it) goes to
  // `sink` (the GPU runs a step that holds it op by op, without its decode graph). A negative
  // position or no sink turns it off.
  void SetResidualTrace(int64_t position, ResidualTraceSink sink) {
    trace_position_ = sink ? position : -1;
    trace_sink_ = std::move(sink);
  }
  // Installs `hook` (an empty one removes it). The CPU backend, the reference, has it; the
  // others refuse with Unimplemented.
  virtual absl::Status SetRouterLogitsHook(RouterLogitsHook hook) {
    return absl::UnimplementedError("router logits hook: only the CPU backend has it");
  }

 protected:
  // The batch row at the traced position, or -1 (none traced, or not in this batch).
  int64_t TraceRow(const std::vector<SeqChunk>& batch) const;

  int64_t trace_position_ = -1;
  ResidualTraceSink trace_sink_;
  ModelRunner(const ModelConfig& c, const ShardSpec& s, const RunnerOptions& o) : config_(c), shard_(s), options_(o) {}

  ModelConfig config_;
  ShardSpec shard_;
  RunnerOptions options_;
};

// Defined by worker/gpu/ when the CUDA backend is built, else by gpu_runner_none.cc.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateGpuModelRunner(const ModelConfig& config, const TensorSource& src,
                                                                   const ShardSpec& shard, const RunnerOptions& options,
                                                                   Communicator* tp_comm);

}  // namespace moeshard
