#include "worker/gpu/decode_graphs.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_check.h"

namespace moeshard::gpu {
namespace {

constexpr size_t kMaxGraphs = 128;

}  // namespace

DecodeGraphs::DecodeGraphs() {
  const char* env = std::getenv("MOESHARD_CUDA_GRAPHS");
  enabled_ = env == nullptr || std::strcmp(env, "0") != 0;
}

DecodeGraphs::~DecodeGraphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
}

absl::Status DecodeGraphs::Launch(int64_t key, cudaStream_t stream, const std::function<absl::Status()>& record) {
  if (!enabled_) return absl::UnavailableError("CUDA graphs are off");
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) return absl::UnavailableError("graph cache full");
    MOESHARD_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    absl::Status recorded = record();
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    cudaGraphExec_t exec = nullptr;
    cudaError_t inst = cudaErrorUnknown;
    if (recorded.ok() && end == cudaSuccess) inst = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (!recorded.ok() || end != cudaSuccess || inst != cudaSuccess) {
      cudaGetLastError();
      enabled_ = false;
      std::fprintf(stderr, "moeshard: CUDA graphs off for this runner (recording a decode step failed: %s)\n",
                   !recorded.ok() ? std::string(recorded.message()).c_str()
                                  : cudaGetErrorString(end != cudaSuccess ? end : inst));
      return absl::UnavailableError("recording failed");
    }
    it = graphs_.emplace(key, exec).first;
  }
  MOESHARD_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, stream));
  return absl::OkStatus();
}

}  // namespace moeshard::gpu
