// Device memory owned by the GPU backend: DeviceBuffer (one cudaMalloc, freed on
// destruction), a bump-allocating DevicePool for weights (chunks of 256 MiB, never freed
// piecemeal) and a StepArena for the scratch of one forward step: sized once at start,
// reset at the beginning of every step, so the hot path never allocates.
// Not thread-safe; every object belongs to one runner.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/gpu_params.h"

namespace moeshard::gpu {

class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer();
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class DevicePool {
 public:
  // chunk_bytes 0: every allocation exactly its size (staging buffers that live briefly).
  explicit DevicePool(size_t chunk_bytes = kDefaultChunk) : chunk_(chunk_bytes) {}
  // Device memory of `bytes`, 256-byte aligned, valid as long as the pool.
  absl::StatusOr<void*> Alloc(size_t bytes);
  // Copies `bytes` from host memory into a new allocation, ordered on `stream` (the stream
  // of the kernels that read it: a plain cudaMemcpy from pageable memory may return before
  // the data lands, and a non-blocking stream does not wait for it).
  absl::StatusOr<void*> Upload(const void* host, size_t bytes, GpuStream stream);
  size_t bytes_in_use() const { return in_use_; }

 private:
  static constexpr size_t kDefaultChunk = size_t{256} << 20;
  size_t chunk_;
  std::vector<DeviceBuffer> chunks_;     // bump allocation continues in chunks_.back()
  std::vector<DeviceBuffer> dedicated_;  // allocations larger than a chunk, one buffer each
  size_t used_ = 0, in_use_ = 0;
};

class StepArena {
 public:
  absl::Status Reserve(size_t bytes);
  void Reset() { used_ = 0; }
  // Allocations after Mark() are dropped by Release(mark): scratch of one layer.
  size_t Mark() const { return used_; }
  void Release(size_t mark) { used_ = mark; }
  // `count` elements of T, 256-byte aligned; ResourceExhausted past the reserved size.
  template <typename T>
  absl::StatusOr<T*> Alloc(size_t count) {
    auto p = AllocBytes(count * sizeof(T));
    if (!p.ok()) return p.status();
    return static_cast<T*>(*p);
  }
  absl::StatusOr<void*> AllocBytes(size_t bytes);
  size_t capacity() const { return buf_.bytes(); }

 private:
  DeviceBuffer buf_;
  size_t used_ = 0;
};

}  // namespace moeshard::gpu
