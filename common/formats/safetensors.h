// safetensors checkpoints, memory-mapped: one file, or a folder with
// model.safetensors.index.json naming the shard of every tensor (Hugging Face hub layout).
// Every header field is validated against the file before use (see safetensors.cc).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/formats/tensor_source.h"
#include "common/mapped_file.h"

namespace moeshard {

class SafetensorsCheckpoint : public TensorSource {
 public:
  // `path`: a .safetensors file, or a folder holding model.safetensors or
  // model.safetensors.index.json (+ shards). Shards are mapped lazily is NOT required:
  // all shards named by the index are opened at load.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& path);
  // Parses one file's header (exposed for tests and the malformed-input corpus).
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> OpenFile(const std::string& file);

  const TensorInfo* Find(const std::string& name) const override;
  std::vector<std::string> Names() const override;
  // The "__metadata__" string map of the first file (may be empty).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors to one safetensors file (make-model and tests). Data is copied as given.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
absl::Status WriteSafetensors(const std::string& file, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace moeshard
