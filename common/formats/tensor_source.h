// A read-only view of checkpoint tensors, whatever file format holds them.
// Shapes are row-major, outermost first (PyTorch order): a GGUF tensor with
// ne = {H, I, E} appears here as {E, I, H}. The data pointer stays valid for the
// lifetime of the source that returned it (files are memory-mapped).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace moeshard {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // empty = scalar
  const uint8_t* data = nullptr;
  uint64_t nbytes = 0;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // nullptr when absent.
  virtual const TensorInfo* Find(const std::string& name) const = 0;
  virtual std::vector<std::string> Names() const = 0;
};

}  // namespace moeshard
