// See gguf_test_util.h.
#include "tests/worker/gguf_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/formats/gguf_quant.h"
#include "common/formats/gguf_reader.h"
#include "common/mapped_file.h"
#include "common/status.h"
#include "worker/model_runner.h"

namespace moeshard::test {

absl::StatusOr<RawGguf> ReadGgufHeader(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  gguf_internal::Reader r(file->data(), file->size());
  char magic[4];
  uint32_t version;
  uint64_t num_tensors, num_kv;
  RETURN_IF_ERROR(r.Read(&magic, "magic"));
  RETURN_IF_ERROR(r.Read(&version, "version"));
  RETURN_IF_ERROR(r.Read(&num_tensors, "tensor count"));
  RETURN_IF_ERROR(r.Read(&num_kv, "kv count"));
  RawGguf g;
  for (uint64_t i = 0; i < num_kv; ++i) {
    std::string key;
    uint32_t type;
    RETURN_IF_ERROR(r.ReadString(&key, "key"));
    RETURN_IF_ERROR(r.Read(&type, key));
    g.kv_types[key] = type;
    if (type == 9) {
      gguf_internal::Reader peek = r;
      uint32_t elem;
      RETURN_IF_ERROR(peek.Read(&elem, key));
      g.array_types[key] = elem;
    }
    GgufValue v;
    RETURN_IF_ERROR(gguf_internal::ReadValue(r, type, key, &v));
  }
  for (uint64_t i = 0; i < num_tensors; ++i) {
    RawTensorInfo t;
    uint32_t n_dims;
    RETURN_IF_ERROR(r.ReadString(&t.name, "tensor name"));
    RETURN_IF_ERROR(r.Read(&n_dims, t.name));
    t.ne.resize(n_dims);
    uint64_t numel = 1;
    for (int64_t& d : t.ne) {
      RETURN_IF_ERROR(r.Read(&d, t.name));
      numel *= d;
    }
    RETURN_IF_ERROR(r.Read(&t.ggml_type, t.name));
    RETURN_IF_ERROR(r.Read(&t.offset, t.name));
    const uint64_t per_block = t.ggml_type == 8 ? 34 : t.ggml_type == 39 ? 17 : 0;
    const uint64_t elem = t.ggml_type == 0 ? 4 : 2;
    t.nbytes = per_block ? numel / 32 * per_block : numel * elem;
    g.tensors.push_back(std::move(t));
  }
  return g;
}

std::vector<float> SourceFloats(const TensorToWrite& t) {
  std::vector<float> v(t.dtype == DType::kBF16 ? t.bytes.size() / 2 : t.bytes.size() / 4);
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == DType::kBF16) {
      uint16_t h;
      std::memcpy(&h, &t.bytes[2 * i], 2);
      v[i] = Bf16ToF32(h);
    } else {
      std::memcpy(&v[i], &t.bytes[4 * i], 4);
    }
  }
  return v;
}

std::vector<float> AsStored(const std::vector<float>& v, DType dtype) {
  std::vector<float> out(v);
  for (float& x : out) {
    if (dtype == DType::kF16) x = F16ToF32(F32ToF16(x));
    if (dtype == DType::kBF16) x = Bf16ToF32(F32ToBf16(x));
  }
  return out;
}

float ElementAsFloat(const TensorInfo& t, size_t k) {
  float f;
  uint16_t h;
  switch (t.dtype) {
    case DType::kF32:
      std::memcpy(&f, t.data + 4 * k, 4);
      return f;
    case DType::kF16:
      std::memcpy(&h, t.data + 2 * k, 2);
      return F16ToF32(h);
    case DType::kBF16:
      std::memcpy(&h, t.data + 2 * k, 2);
      return Bf16ToF32(h);
    default:
      return NAN;
  }
}

std::vector<float> GgmlQuantDequant(const float* x, int64_t n, bool q8_0) {
  std::string q;
  if (q8_0)
    QuantizeRowQ8_0(x, n, &q);
  else
    QuantizeRowMxfp4(x, n, &q);
  static constexpr int kDoubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  std::vector<float> out(n);
  const uint8_t* b = reinterpret_cast<const uint8_t*>(q.data());
  for (int64_t blk = 0; blk < n / 32; ++blk) {
    float* y = out.data() + 32 * blk;
    if (q8_0) {
      uint16_t h;
      std::memcpy(&h, b + 34 * blk, 2);
      const float d = F16ToF32Exact(h);
      for (int j = 0; j < 32; ++j) y[j] = static_cast<int8_t>(b[34 * blk + 2 + j]) * d;
    } else {
      const uint8_t* p = b + 17 * blk;
      const float half = std::ldexp(1.f, static_cast<int>(p[0]) - 128);
      for (int j = 0; j < 16; ++j) {
        y[j] = kDoubled[p[1 + j] & 0xf] * half;
        y[j + 16] = kDoubled[p[1 + j] >> 4] * half;
      }
    }
  }
  return out;
}

float HalfStep(const float* block, float x, bool q8_0) {
  float amax = 0.f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(block[j]));
  if (q8_0) {
    const float d = amax / 127.f, d16 = F16ToF32Exact(F32ToF16(d));
    const float q = d > 0.f ? std::round(x / d) : 0.f;
    return 0.5f * d * (1.f + 1e-4f) + std::fabs(q) * std::fabs(d16 - d);
  }
  const float scale = std::ldexp(1.f, static_cast<int>(Mxfp4Exponent(amax)) - 127);
  const float a = std::fabs(x) / scale;
  if (a > 6.f) return a * scale - 6.f * scale;  // saturated to 6 * scale
  return (a < 2.f ? 0.25f : a < 4.f ? 0.5f : 1.f) * scale * (1.f + 1e-6f);
}

std::vector<std::vector<int32_t>> SomeSequences(int64_t vocab_size) {
  std::vector<std::vector<int32_t>> seqs;
  uint64_t s = 12345;
  for (int64_t len : {1, 7, 33}) {
    std::vector<int32_t> ids(len);
    for (int32_t& id : ids) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      id = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab_size));
    }
    seqs.push_back(std::move(ids));
  }
  return seqs;
}

absl::StatusOr<std::vector<float>> Logits(const LoadedModel& model, const std::vector<int32_t>& ids) {
  RunnerOptions ro;
  ro.num_kv_blocks = 16;
  ShardSpec shard{0, model.config.num_layers, 0, 1, true, true};
  ASSIGN_OR_RETURN(auto runner, ModelRunner::Create(model.config, *model.source, shard, ro));
  std::vector<int32_t> table;
  for (int64_t b = 0; b * ro.block_size < static_cast<int64_t>(ids.size()); ++b)
    table.push_back(static_cast<int32_t>(b));
  std::vector<float> logits;
  RETURN_IF_ERROR(runner->Forward({SeqChunk{ids, 0, table, true}}, &logits));
  return logits;
}

}  // namespace moeshard::test
