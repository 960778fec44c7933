// Helpers of the GGUF export tests: a raw walk of a GGUF header that keeps what our reader
// folds away (the stored value type of every key, the element type of arrays, tensor
// offsets), ggml's expansion formulas written out independently of kernels/, the error
// bound of one quantized value, and the engine's logits for a token sequence.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/formats/safetensors.h"
#include "tests/formats/format_test_util.h"
#include "common/model/model_loader.h"

namespace moeshard::test {

struct RawTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // innermost first, as stored
  uint32_t ggml_type = 0;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

struct RawGguf {
  std::map<std::string, uint32_t> kv_types;     // GGUF value type of each key
  std::map<std::string, uint32_t> array_types;  // element type of each array key
  std::vector<RawTensorInfo> tensors;           // in file order
};
absl::StatusOr<RawGguf> ReadGgufHeader(const std::string& path);

// A source tensor (BF16 or F32) as floats.
std::vector<float> SourceFloats(const TensorToWrite& t);
// Each value rounded to `dtype` (F32, F16 or BF16) and back.
std::vector<float> AsStored(const std::vector<float>& v, DType dtype);
// Element k of a plain (F32/F16/BF16) tensor.
float ElementAsFloat(const TensorInfo& t, size_t k);

// Row `x` of n values quantized by QuantizeRowQ8_0 / QuantizeRowMxfp4 and expanded as
// ggml's dequantize_row_q8_0 / dequantize_row_mxfp4 do (d * q; kvalues_mxfp4 * e8m0 / 2).
std::vector<float> GgmlQuantDequant(const float* x, int64_t n, bool q8_0);
// The largest |dequantized - x| the format allows for value `x` of the 32-value block
// starting at `block`: Q8_0 d / 2 plus |q| times the f16 rounding of d; MXFP4 half the gap
// of the E2M1 grid around |x| / scale, or up to 2 * scale where |x| > 6 * scale saturates.
float HalfStep(const float* block, float x, bool q8_0);

// A few token sequences of different lengths below `vocab_size`.
std::vector<std::vector<int32_t>> SomeSequences(int64_t vocab_size);
// Logits [T, V] of `ids` fed from position 0 through one single-worker CPU runner.
absl::StatusOr<std::vector<float>> Logits(const LoadedModel& model, const std::vector<int32_t>& ids);

}  // namespace moeshard::test
