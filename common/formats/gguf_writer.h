// Writes GGUF v3 files that llama.cpp's gguf.cpp and our GgufFile both read: metadata
// key-value pairs in insertion order (general.alignment = 32 as u32 always comes first),
// then the tensor infos, then the tensors, each starting at a multiple of the alignment
// and laid out in the order they were added (llama.cpp checks that every offset equals
// the padded end of the previous tensor). Shapes are given row-major, outermost first,
// like TensorInfo::shape, and stored reversed (ne[0] = the row length).
// Not thread-safe; the writer holds every tensor's bytes until Write, except those added by
// layout alone, whose bytes WriteStreamed asks for while it writes (several at a time).
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

  // A tensor whose bytes come later, from WriteStreamed's filler.
  absl::Status AddTensorLayout(const std::string& name, GgmlType type, const std::vector<int64_t>& shape);

  // Any error of an Add* call (a duplicate key) is reported here, before the file is made.
  // Refuses a writer with tensors added by layout.
  absl::Status Write(const std::string& path) const;

  // Fills the `index`-th tensor (in the order added) with exactly its bytes.
  using TensorFiller = std::function<absl::Status(size_t index, std::string* bytes)>;
  // Writes the header, then `threads` threads fill the layout-only tensors (in any order,
  // `fill` must be thread-safe) and write each at its offset: at most `threads` tensors are
  // in memory at once. The first error stops the work and is returned.
  absl::Status WriteStreamed(const std::string& path, int threads, const TensorFiller& fill) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;  // innermost first
    uint64_t size;
    std::string bytes;  // empty for a tensor added by layout
  };
  void AddKey(const std::string& key, uint32_t value_type, const std::string& payload);
  // The tensor's byte size, or why it cannot be added.
  absl::StatusOr<uint64_t> CheckTensor(const std::string& name, GgmlType type, const std::vector<int64_t>& shape) const;
  std::string Header() const;  // everything before the data section, padded

  std::string kv_bytes_;  // encoded key-value pairs
  uint64_t num_kv_ = 0;
  std::set<std::string> keys_;
  absl::Status deferred_;  // first metadata error
  std::vector<Tensor> tensors_;
  std::set<std::string> tensor_names_;
  bool streamed_ = false;  // some tensor was added by layout
};

}  // namespace moeshard
