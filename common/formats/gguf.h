// GGUF v2/v3 files (llama.cpp's format), memory-mapped. Metadata key-value pairs and
// tensors F32, F16, BF16, Q8_0 and MXFP4 (also the plain I8/I16/I32/I64/F64 types).
// Tensors of other ggml types (Q4_K, ...) do not stop the file from loading: Find() returns
// nullptr for them and Names() leaves them out, while TensorStatus() says why
// ("unsupported ggml type N for tensor X") so a loader can report it.
// Every count, length, offset, alignment and type is checked against the file size.
// Thread-safety: immutable after Open; all const methods may be called concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/formats/tensor_source.h"
#include "common/mapped_file.h"

namespace moeshard {

// One metadata value. Integers of any width are held as int64 (uint64 above INT64_MAX
// is refused), floats as double; arrays hold one kind of element.
struct GgufValue {
  enum class Kind { kInt, kFloat, kBool, kString, kIntArray, kFloatArray, kBoolArray, kStringArray };
  Kind kind = Kind::kInt;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::string s;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;  // also holds nothing for bool arrays; bools go to ints (0/1)
};

class GgufFile : public TensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);

  const TensorInfo* Find(const std::string& name) const override;
  std::vector<std::string> Names() const override;
  // OK when Find(name) succeeds; NotFound when the file has no such tensor; Unimplemented
  // "unsupported ggml type N for tensor X" when it has one of a type this engine cannot read.
  absl::Status TensorStatus(const std::string& name) const;
  // Tensors left out of Find()/Names(), with their ggml type.
  const std::map<std::string, uint32_t>& unsupported_tensors() const { return unsupported_; }

  bool Has(const std::string& key) const { return kv_.count(key) != 0; }
  const GgufValue* Get(const std::string& key) const;
  // Typed getters: NotFound naming the key when absent, InvalidArgument naming the key
  // and both kinds when the kind differs. GetInt accepts any integer kind, GetFloat also ints.
  absl::StatusOr<int64_t> GetInt(const std::string& key) const;
  absl::StatusOr<double> GetFloat(const std::string& key) const;
  absl::StatusOr<bool> GetBool(const std::string& key) const;
  absl::StatusOr<std::string> GetString(const std::string& key) const;
  absl::StatusOr<const std::vector<std::string>*> GetStringArray(const std::string& key) const;
  absl::StatusOr<const std::vector<int64_t>*> GetIntArray(const std::string& key) const;  // also bool arrays

  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return kv_; }

 private:
  std::unique_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, uint32_t> unsupported_;  // name -> ggml type
};

}  // namespace moeshard
