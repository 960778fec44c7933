#include "worker/gpu/device_memory.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace moeshard::gpu {
namespace {

size_t AlignUp(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  cudaError_t err = cudaMalloc(&b.ptr_, bytes ? bytes : 1);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free allocation error
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc of ", bytes, " bytes: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
  b.bytes_ = bytes;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

absl::StatusOr<void*> DevicePool::Alloc(size_t bytes) {
  bytes = AlignUp(bytes);
  if (bytes > chunk_) {
    auto b = DeviceBuffer::Allocate(bytes);
    if (!b.ok()) return b.status();
    void* p = b->get();
    // Kept apart from the bump chunks: the open chunk must stay the one bump allocation
    // continues in (a large first allocation must not become the "open" chunk).
    dedicated_.push_back(std::move(*b));
    in_use_ += bytes;
    return p;
  }
  if (chunks_.empty() || used_ + bytes > chunks_.back().bytes()) {
    auto b = DeviceBuffer::Allocate(chunk_);
    if (!b.ok()) return b.status();
    chunks_.push_back(std::move(*b));
    used_ = 0;
  }
  void* p = static_cast<char*>(chunks_.back().get()) + used_;
  used_ += bytes;
  in_use_ += bytes;
  return p;
}

absl::StatusOr<void*> DevicePool::Upload(const void* host, size_t bytes, GpuStream stream) {
  auto p = Alloc(bytes);
  if (!p.ok()) return p.status();
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(*p, host, bytes, cudaMemcpyHostToDevice, stream));
  return *p;
}

absl::Status StepArena::Reserve(size_t bytes) {
  auto b = DeviceBuffer::Allocate(bytes);
  if (!b.ok()) return b.status();
  buf_ = std::move(*b);
  used_ = 0;
  return absl::OkStatus();
}

absl::StatusOr<void*> StepArena::AllocBytes(size_t bytes) {
  bytes = AlignUp(bytes);
  if (used_ + bytes > buf_.bytes()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("step arena of ", buf_.bytes(), " bytes cannot hold ", used_ + bytes, " bytes"));
  }
  void* p = static_cast<char*>(buf_.get()) + used_;
  used_ += bytes;
  return p;
}

}  // namespace moeshard::gpu
