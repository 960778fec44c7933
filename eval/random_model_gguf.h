// `make-model --format gguf`: a random qwen3_moe model (the same weights as the
// safetensors folder of the same spec) as one GGUF file that llama.cpp loads, with the
// tensor names, shapes and metadata of llama.cpp's qwen3moe architecture:
//   token_embd / output [V, H], output_norm [H]; per layer blk.N.attn_norm [H],
//   attn_q [nq*hd, H], attn_k / attn_v [nkv*hd, H], attn_output [H, nq*hd],
//   attn_q_norm / attn_k_norm [hd], ffn_norm [H], ffn_gate_inp [E, H],
//   ffn_gate_exps / ffn_up_exps [E, I, H], ffn_down_exps [E, H, I]
// (shapes row-major as TensorInfo gives them; the file stores them reversed, ne[0] = H
// for ffn_gate_exps). Experts are Q8_0 or MXFP4 (quantized as ggml does), norms and the
// router F32 (as convert_hf_to_gguf.py keeps them), every other matrix BF16, F16 or Q8_0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "eval/random_model.h"
#include "common/formats/gguf_writer.h"

namespace moeshard {

struct GgufExportOptions {
  GgmlType expert_type = GgmlType::kQ8_0;  // kQ8_0 | kMXFP4
  GgmlType dense_type = GgmlType::kBF16;   // kBF16 | kF16 | kQ8_0 (the embedding too)
  // A folder with tokenizer.json (+ tokenizer_config.json, config.json) whose tokenizer
  // goes into the file; empty = the byte-level tokenizer the safetensors folder gets.
  std::string tokenizer_dir;
};

absl::StatusOr<GgmlType> ParseExpertType(const std::string& s);  // q8_0 | mxfp4
absl::StatusOr<GgmlType> ParseDenseType(const std::string& s);   // bf16 | f16 | q8_0

// One tensor of the GGUF file: its llama.cpp name, row-major shape and type, and the hub
// tensor it comes from ("*" stands for the expert index of a stacked expert tensor).
struct GgufTensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  GgmlType type;
  std::string hub;
};
// Every tensor a qwen3_moe config puts in the file, in file order.
std::vector<GgufTensorPlan> PlanQwen3MoeGguf(const ModelConfig& config, const GgufExportOptions& options);

// Writes `out_file`. Only qwen3_moe has a llama.cpp architecture (qwen3moe); other
// archs are refused. With a tokenizer folder, the vocabulary size is --vocab when given,
// else the folder's config.json vocab_size, else the tokenizer's own size.
absl::Status WriteRandomGguf(const RandomModelSpec& spec, const GgufExportOptions& options,
                             const std::string& out_file);

// The same layout and metadata with synthetic weights, for sizes whose hub weights would not
// fit in memory (--preset full: Qwen3-30B-A3B, 15.9 GiB with MXFP4 experts): block types get
// random codes and one scale per tensor chosen for the deviation the hub weights have, plain
// types uniform values; `threads` threads make and write tensors at their offsets, so only
// `threads` tensors are in memory at once. Not the weights of WriteRandomGguf's file.
absl::Status WriteSyntheticGguf(const RandomModelSpec& spec, const GgufExportOptions& options,
                                const std::string& out_file, int threads);

}  // namespace moeshard
