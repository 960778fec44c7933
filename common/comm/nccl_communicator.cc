#include "common/comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace moeshard {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status CudaErr(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(int rank, int size, int device) : rank_(rank), size_(size), device_(device) {}
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (comm_) {
      if (aborted_) {
        ncclCommAbort(comm_);
      } else {
        ncclCommFinalize(comm_);
        Poll("finalize").IgnoreError();
        ncclCommDestroy(comm_);
      }
    }
    if (scratch_) cudaFree(scratch_);
    if (own_stream_) cudaStreamDestroy(own_stream_);
  }

  absl::Status Init(const ncclUniqueId& id) {
    if (auto s = CudaErr(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
    if (auto s = CudaErr(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate"); !s.ok()) {
      return s;
    }
    stream_ = own_stream_;
    if (auto s = CudaErr(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc"); !s.ok()) return s;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (r != ncclSuccess && r != ncclInProgress) return NcclError(r, "ncclCommInitRankConfig");
    return Poll("init");
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool device_memory() const override { return true; }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }

  absl::Status AllReduceSum(float* data, size_t count) override {
    return Run("all_reduce", [&] { return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_); });
  }
  absl::Status AllGather(const float* in, size_t count, float* out) override {
    return Run("all_gather", [&] { return ncclAllGather(in, out, count, ncclFloat32, comm_, stream_); });
  }
  absl::Status Send(const void* data, size_t bytes, int dst) override {
    return Run("send", [&] { return ncclSend(data, bytes, ncclChar, dst, comm_, stream_); });
  }
  absl::Status Recv(void* data, size_t bytes, int src) override {
    return Run("recv", [&] { return ncclRecv(data, bytes, ncclChar, src, comm_, stream_); });
  }
  absl::Status Barrier() override {
    return Run("barrier", [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_); });
  }
  void Abort() override { abort_requested_ = true; }

 private:
  absl::Status NcclError(ncclResult_t r, const char* what) {
    return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(r), " (", ncclGetLastError(comm_), ")"));
  }

  template <typename F>
  absl::Status Run(const char* what, F&& enqueue) {
    if (aborted_ || abort_requested_) return absl::AbortedError(absl::StrCat("nccl ", what, ": communicator aborted"));
    if (auto s = CudaErr(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
    ncclResult_t r = enqueue();
    if (r != ncclSuccess && r != ncclInProgress) {
      AbortNow();
      return NcclError(r, what);
    }
    if (absl::Status s = Poll(what); !s.ok()) return s;
    // The operation is enqueued; wait for the stream with the same deadline.
    const auto deadline = Clock::now() + timeout();
    while (true) {
      cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return absl::OkStatus();
      if (q != cudaErrorNotReady) {
        AbortNow();
        return CudaErr(q, what);
      }
      if (absl::Status s = CheckAsync(what, deadline); !s.ok()) return s;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // Waits while the communicator reports ncclInProgress (non-blocking init and enqueue).
  absl::Status Poll(const char* what) {
    const auto deadline = Clock::now() + timeout();
    while (true) {
      bool in_progress = false;
      if (absl::Status s = CheckAsync(what, deadline, &in_progress); !s.ok() || !in_progress) return s;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // The communicator's asynchronous state: an error, an abort request or a passed deadline
  // abort it and return the reason; otherwise OK, with `in_progress` telling whether NCCL
  // still works on the last call.
  absl::Status CheckAsync(const char* what, Clock::time_point deadline, bool* in_progress = nullptr) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      AbortNow();
      return NcclError(r != ncclSuccess ? r : state, what);
    }
    if (in_progress) *in_progress = state == ncclInProgress;
    if (state == ncclSuccess && in_progress) return absl::OkStatus();
    if (abort_requested_) {
      AbortNow();
      return absl::AbortedError(absl::StrCat("nccl ", what, ": aborted"));
    }
    if (Clock::now() > deadline) {
      AbortNow();
      return absl::DeadlineExceededError(
          absl::StrCat("nccl ", what, " did not complete within ", timeout().count(), " ms; communicator aborted"));
    }
    return absl::OkStatus();
  }

  void AbortNow() {
    if (!aborted_ && comm_) ncclCommAbort(comm_);
    aborted_ = true;
    comm_ = nullptr;
  }

  int rank_, size_, device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr, own_stream_ = nullptr;
  float* scratch_ = nullptr;
  bool aborted_ = false;
  std::atomic<bool> abort_requested_{false};
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateNcclCommunicator(KvStore* store, const std::string& prefix,
                                                                     int rank, int size, int device,
                                                                     std::chrono::milliseconds timeout) {
  if (size < 1 || rank < 0 || rank >= size) return absl::InvalidArgumentError("nccl: rank outside the group");
  if (auto s = CudaErr(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  ncclUniqueId id;
  const std::string key = absl::StrCat(prefix, "/nccl_id");
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return absl::InternalError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
    if (size > 1) {
      absl::Status s = store->Set(key, absl::Base64Escape(absl::string_view(id.internal, sizeof(id.internal))));
      if (!s.ok()) return s;
    }
  } else {
    auto v = store->Get(key, timeout);
    if (!v.ok()) return absl::Status(v.status().code(), absl::StrCat("nccl bootstrap: ", v.status().message()));
    std::string raw;
    if (!absl::Base64Unescape(*v, &raw) || raw.size() != sizeof(id.internal)) {
      return absl::InvalidArgumentError("nccl bootstrap: the published id is malformed");
    }
    std::memcpy(id.internal, raw.data(), raw.size());
  }
  auto c = std::make_unique<NcclCommunicator>(rank, size, device);
  c->set_timeout(timeout);
  if (absl::Status s = c->Init(id); !s.ok()) return s;
  return std::unique_ptr<Communicator>(std::move(c));
}

absl::StatusOr<std::string> GpuBusId(int device) {
  char bus[64] = {0};
  if (auto s = CudaErr(cudaDeviceGetPCIBusId(bus, sizeof(bus), device), "cudaDeviceGetPCIBusId"); !s.ok()) return s;
  return std::string(bus);
}

}  // namespace moeshard
