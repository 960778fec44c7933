// Writes GGUF v3 files that llama.cpp's gguf.cpp and our GgufFile both read: metadata
// key-value pairs in insertion order (general.alignment = 32 as u32 always comes first),
// then the tensor infos, then the tensors, each starting at a multiple of the alignment
// and laid out in the order they were added (llama.cpp checks that every offset equals
// the padded end of the previous tensor). Shapes are given row-major, outermost first,
// like TensorInfo::shape, and stored reversed (ne[0] = the row length).
// Not thread-safe; the writer holds every tensor's bytes until Write.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace moeshard {

// ggml tensor types the writer knows (ggml.h's enum ggml_type).
enum class GgmlType : uint32_t { kF32 = 0, kF16 = 1, kQ8_0 = 8, kBF16 = 30, kMXFP4 = 39 };
const char* GgmlTypeName(GgmlType t);

class GgufWriter {
 public:
  static constexpr uint32_t kAlignment = 32;
  static constexpr size_t kMaxNameBytes = 63;  // GGML_MAX_NAME - 1

  GgufWriter();

  // Metadata. Integer keys that llama.cpp reads into uint32 must be u32 (its loader
  // checks the stored type), floats f32, token types an i32 array.
  void AddString(const std::string& key, const std::string& value);
  void AddU32(const std::string& key, uint32_t value);
  void AddF32(const std::string& key, float value);
  void AddBool(const std::string& key, bool value);
  void AddStringArray(const std::string& key, const std::vector<std::string>& values);
  void AddI32Array(const std::string& key, const std::vector<int32_t>& values);

  // `bytes` must hold exactly the tensor's data in `type` (row length shape.back(), a
  // multiple of 32 for the block types). Names are unique and at most 63 bytes.
  absl::Status AddTensor(const std::string& name, GgmlType type, const std::vector<int64_t>& shape, std::string bytes);

  // Any error of an Add* call (a duplicate key) is reported here, before the file is made.
  absl::Status Write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;  // innermost first
    std::string bytes;
  };
  void AddKey(const std::string& key, uint32_t value_type, const std::string& payload);

  std::string kv_bytes_;  // encoded key-value pairs
  uint64_t num_kv_ = 0;
  std::set<std::string> keys_;
  absl::Status deferred_;  // first metadata error
  std::vector<Tensor> tensors_;
  std::set<std::string> tensor_names_;
};

}  // namespace moeshard
