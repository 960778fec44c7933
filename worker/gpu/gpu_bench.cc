// RunModelBench (worker/model_bench.h): ceilings first (copy bandwidth, bf16 GEMM rate),
// then one random-weight runner: a timed prefill of `prompt_len` tokens, then for each
// stream count S, S sequences prefilled to `prompt_len` and `decode_steps` timed decode
// steps of S tokens. Decode's floor is the bytes one step must read (dense weights, the
// experts S tokens touch in expectation under uniform routing, the KV cache, the LM head)
// over the copy bandwidth; prefill's is its FLOPs over the GEMM rate.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/kv_pools.h"
#include "common/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gpu_ops.h"
#include "kernels/cuda/probe.h"
#include "kernels/moe/moe_expert.h"
#include "worker/gpu/device_memory.h"
#include "worker/kv_cache.h"
#include "worker/model_bench.h"

namespace moeshard {
namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// GB/s of a device-to-device copy, counting bytes read plus bytes written.
absl::StatusOr<double> CopyBandwidth(int gpu) {
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaSetDevice(gpu));
  const size_t bytes = size_t{1} << 30;
  ASSIGN_OR_RETURN(auto a, gpu::DeviceBuffer::Allocate(bytes));
  ASSIGN_OR_RETURN(auto b, gpu::DeviceBuffer::Allocate(bytes));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemset(a.get(), 1, bytes));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice);  // warm
  cudaEventRecord(e0);
  const int reps = 10;
  for (int i = 0; i < reps; ++i) cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e1));
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * bytes * reps / (ms * 1e-3) / 1e9;
}

// TFLOP/s of an 8192³ bf16 GEMM through cuBLAS (fp32 accumulation), random inputs.
absl::StatusOr<double> GemmRate(int gpu) {
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaSetDevice(gpu));
  const int64_t n = 8192;
  ASSIGN_OR_RETURN(auto a, gpu::DeviceBuffer::Allocate(n * n * 2));
  ASSIGN_OR_RETURN(auto b, gpu::DeviceBuffer::Allocate(n * n * 2));
  ASSIGN_OR_RETURN(auto c, gpu::DeviceBuffer::Allocate(n * n * 2));
  RETURN_IF_ERROR(gpu::Fill({a.get(), n * n, gpu::FillKind::kUniformBf16, 1.f, 1}, nullptr));
  RETURN_IF_ERROR(gpu::Fill({b.get(), n * n, gpu::FillKind::kUniformBf16, 1.f, 2}, nullptr));
  ASSIGN_OR_RETURN(auto gemm, gpu::Gemm::Create(nullptr));
  gpu::GemmArgs g;
  g.w = {a.get(), gpu::ActDType::kBF16, n, n};
  g.x = b.get();
  g.x_dtype = gpu::ActDType::kBF16;
  g.y = c.get();
  g.y_dtype = gpu::ActDType::kBF16;
  g.num_tokens = n;
  RETURN_IF_ERROR(gemm->Run(g));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  const int reps = 10;
  auto t0 = Clock::now();
  for (int i = 0; i < reps; ++i) RETURN_IF_ERROR(gemm->Run(g));
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return 2.0 * n * n * n * reps / Since(t0) / 1e12;
}

double ExpertBytes(WeightFormat f, int64_t Lw, int64_t I) {
  // gate and up: I rows of Lw; down: Lw rows of I.
  double b = 2.0 * I * WeightRowBytes(f, Lw) + Lw * WeightRowBytes(f, I);
  if (f == WeightFormat::kNVFP4) b += (2.0 * I * Lw + Lw * I) / 16.0;  // e4m3 block scales
  return b;
}

}  // namespace

absl::StatusOr<std::string> RunModelBench(const ModelConfig& c, const ModelBenchOptions& o) {
  const int gpu = o.runner.gpu_index;
  ASSIGN_OR_RETURN(double copy_gbs, CopyBandwidth(gpu));
  ASSIGN_OR_RETURN(double tflops, GemmRate(gpu));
  const int64_t max_streams = *std::max_element(o.streams.begin(), o.streams.end());
  RunnerOptions ro = o.runner;
  ro.device = Device::kCuda;
  const int64_t per_seq = (o.prompt_len + o.decode_steps + ro.block_size) / ro.block_size + 1;
  ro.num_kv_blocks = per_seq * (max_streams + 1);
  ro.max_batch_tokens = std::max<int64_t>(o.prompt_len, max_streams);
  ro.profile = true;
  const ShardSpec whole{0, c.num_layers, 0, 1, true, true};
  auto t_load = Clock::now();
  ASSIGN_OR_RETURN(auto runner, CreateRandomGpuModelRunner(c, whole, ro, o.expert_format, o.seed, nullptr, o.dense_format));
  const double load_s = Since(t_load);
  const bool bf16 = ro.precision == ActPrecision::kBFloat16;
  const double act = bf16 ? 2 : 4;
  const double kv_elem = ro.kv_dtype == KvDType::kFp8E4M3 ? 1 : ro.kv_dtype == KvDType::kFloat32 ? 4
                         : ro.kv_dtype == KvDType::kBFloat16 ? 2 : act;
  const int64_t H = c.hidden_size, hd = c.head_dim, Lw = c.expert_width(), I = c.expert_intermediate;
  const double kv_per_token_layer = 2.0 * c.num_kv_heads * hd * kv_elem + (kv_elem == 1 ? 8.0 * c.num_kv_heads : 0);
  // Bytes per dense weight: the activation dtype, or split Q8's 8.5 bits.
  const double dense_elem = o.dense_format == WeightFormat::kQ8_0 && bf16 ? 34.0 / 32.0 : act;
  double dense_layer = dense_elem * (2.0 * c.num_heads * hd * H + 2.0 * c.num_kv_heads * hd * H);
  if (c.attn_output_gate) dense_layer += dense_elem * c.num_heads * H;
  if (c.latent_size > 0) dense_layer += dense_elem * 2.0 * Lw * H;
  dense_layer += 4.0 * c.num_experts * H;  // fp32 router
  const double expert_bytes = ExpertBytes(o.expert_format, Lw, I);
  const double head_bytes = dense_elem * c.vocab_size * H;

  std::mt19937 rng(static_cast<uint32_t>(o.seed));
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size - 1));
  BlockAllocator blocks(ro.num_kv_blocks);
  auto prompt = [&] {
    std::vector<int32_t> ids(o.prompt_len);
    for (auto& t : ids) t = tok(rng);
    return ids;
  };
  std::vector<float> logits;
  std::vector<std::string> profiles;
  std::string rep = absl::StrFormat(
      "model: %s, %d layers, hidden %d, %d experts top-%d, expert width %d x %d, experts %s, dense %s, %s, KV %s\n"
      "ceilings (this run): copy %.0f GB/s (read + write), bf16 GEMM %.0f TFLOP/s; weights made in %.1f s\n",
      c.model_type, c.num_layers, H, c.num_experts, c.top_k, Lw, I, WeightFormatName(o.expert_format),
      dense_elem == act ? (bf16 ? "bf16" : "f32") : "q8_0", runner->backend(), ro.kv_dtype == KvDType::kFp8E4M3 ? "fp8" : bf16 ? "bf16" : "fp32", copy_gbs, tflops, load_s);
  absl::StrAppend(&rep, absl::StrFormat("KV cache: %.0f bytes per token (all layers)\n", kv_per_token_layer * c.num_layers));
  // The memory plan by layer kind (what a serving pool holds for one sequence at this context).
  const KvBytesByKind kinds = SequenceKvBytes(c, kv_per_token_layer, o.prompt_len, ro.block_size);
  absl::StrAppend(&rep, absl::StrFormat("KV of one sequence at %d tokens: %d full-attention layers %.1f MB",
                                        o.prompt_len, kinds.full_layers, kinds.full_bytes / 1e6));
  if (kinds.sliding_layers > 0) {
    absl::StrAppend(&rep, absl::StrFormat("; %d sliding-window layers (window %d) %.1f MB, flat past the window",
                                          kinds.sliding_layers, c.sliding_window, kinds.sliding_bytes / 1e6));
  }
  absl::StrAppend(&rep, "\n");

  // Prefill: warm up once, then time one prompt.
  {
    std::vector<int32_t> table;
    RETURN_IF_ERROR(blocks.Reserve(table, o.prompt_len, ro.block_size));
    runner->SetProfiling(false);
    RETURN_IF_ERROR(runner->Forward({SeqChunk{prompt(), 0, table, false}}, &logits));
    auto t0 = Clock::now();
    RETURN_IF_ERROR(runner->Forward({SeqChunk{prompt(), 0, table, false}}, &logits));
    const double s = Since(t0);
    // The same prompt once more with the regions timed (events cost host time, so the timed
    // run above has them off).
    runner->SetProfiling(true);
    runner->ResetProfile();
    RETURN_IF_ERROR(runner->Forward({SeqChunk{prompt(), 0, table, false}}, &logits));
    runner->SetProfiling(false);
    profiles.push_back(absl::StrCat("prefill: ", runner->ProfileReport()));
    blocks.Free(table);
    // Per token: 2 FLOPs per weight of the dense projections and of k experts' three matrices,
    // plus attention (QK and PV: 4·hd per visible key per query head; causal average ctx/2,
    // sliding layers capped at the window).
    double flops_token = 2.0 * (2.0 * c.num_heads * hd * H + 2.0 * c.num_kv_heads * hd * H +
                         (c.attn_output_gate ? c.num_heads * H : 0) + (c.latent_size > 0 ? 2.0 * Lw * H : 0) +
                         c.num_experts * H + c.top_k * 3.0 * Lw * I) * c.num_layers;
    double attn = 0;
    for (const LayerSpec& l : c.layers) {
      const double ctx = l.sliding && c.sliding_window > 0 ? std::min<double>(c.sliding_window, o.prompt_len / 2.0)
                                                           : o.prompt_len / 2.0;
      attn += 4.0 * hd * c.num_heads * ctx;
    }
    flops_token += attn;
    const double floor_s = flops_token * o.prompt_len / (tflops * 1e12);
    absl::StrAppend(&rep, absl::StrFormat(
        "\n| phase | tokens | time | tok/s | floor | time / floor |\n|---|---|---|---|---|---|\n"
        "| prefill | %d | %.1f ms | %.0f | %.1f ms (FLOPs / GEMM rate) | %.1f |\n",
        o.prompt_len, 1e3 * s, o.prompt_len / s, 1e3 * floor_s, s / floor_s));
  }
  // Decode: S streams at context prompt_len.
  for (int64_t S : o.streams) {
    std::vector<std::vector<int32_t>> tables(S);
    for (int64_t i = 0; i < S; ++i) {
      RETURN_IF_ERROR(blocks.Reserve(tables[i], o.prompt_len + o.decode_steps + 2, ro.block_size));
      RETURN_IF_ERROR(runner->Forward({SeqChunk{prompt(), 0, tables[i], false}}, &logits));
    }
    auto step = [&](int64_t j) {
      std::vector<SeqChunk> b;
      for (int64_t i = 0; i < S; ++i) b.push_back({{tok(rng)}, o.prompt_len + j, tables[i], false});
      return runner->Forward(b, &logits);
    };
    RETURN_IF_ERROR(step(0));
    auto t0 = Clock::now();
    for (int64_t j = 1; j <= o.decode_steps / 2; ++j) RETURN_IF_ERROR(step(j));
    const double step_s = Since(t0) / (o.decode_steps / 2);
    runner->SetProfiling(true);
    runner->ResetProfile();
    for (int64_t j = o.decode_steps / 2 + 1; j <= o.decode_steps; ++j) RETURN_IF_ERROR(step(j));
    runner->SetProfiling(false);
    profiles.push_back(absl::StrCat("decode ", S, ": ", runner->ProfileReport()));
    if (gpu::ProbeCompiledIn()) {  // a -DMOESHARD_PROBE=ON build: one more step, its chain recorded
      RETURN_IF_ERROR(gpu::ProbeArm(1u << 20));
      RETURN_IF_ERROR(step(o.decode_steps + 1));
      uint32_t dropped = 0;
      ASSIGN_OR_RETURN(auto recs, gpu::ProbeCollect(&dropped));
      RETURN_IF_ERROR(gpu::ProbeDisarm());
      profiles.push_back(absl::StrCat("decode ", S, " chain (", dropped, " records dropped): ", gpu::ProbeTimeline(recs)));
    }
    for (auto& t : tables) blocks.Free(t);
    const double touched = c.num_experts * (1.0 - std::pow(1.0 - static_cast<double>(c.top_k) / c.num_experts, S));
    double kv_read = 0;
    for (const LayerSpec& l : c.layers) {
      const double ctx = l.sliding && c.sliding_window > 0 ? std::min<double>(c.sliding_window, o.prompt_len)
                                                           : o.prompt_len;
      kv_read += S * ctx * kv_per_token_layer;
    }
    const double bytes = c.num_layers * (dense_layer + touched * expert_bytes) + kv_read + head_bytes;
    // The copy figure counts read + write, i.e. the bytes the memory moves per second; a pure
    // read stream moves the same bytes per second, so the floor is bytes / copy bandwidth.
    const double read_floor_s = bytes / (copy_gbs * 1e9);
    absl::StrAppend(&rep, absl::StrFormat(
        "| decode, %d stream%s | %d per step | %.2f ms / step | %.1f | %.2f ms (%.2f GB / copy BW) | %.1f (%.0f%% of copy BW) |\n",
        S, S == 1 ? "" : "s", S, 1e3 * step_s, S / step_s, 1e3 * read_floor_s, bytes / 1e9, step_s / read_floor_s,
        100.0 * read_floor_s / step_s));
  }
  // Which expert kernels the run's steps took (host-side counts; a replayed graph counts at capture).
  const gpu::MoePathCounts paths = gpu::MoeExpertPathCounts();
  absl::StrAppend(&rep, absl::StrFormat("\nExpert steps enqueued: %llu (%llu direct GEMV over repacked experts, %llu of them "
                                        "with the MLP residual update inside down)\n",
                                        paths.steps, paths.stream_direct, paths.down_residual));
  absl::StrAppend(&rep, "\nDevice time by region (CUDA events, in separate runs; the rest of a step is host work and launches):\n");
  for (const auto& p : profiles) absl::StrAppend(&rep, "  ", p, "\n");
  return rep;
}

}  // namespace moeshard
