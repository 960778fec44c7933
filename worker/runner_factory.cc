// ModelRunner::Create: the backend of RunnerOptions::device, traced when the environment asks
// (MOESHARD_TRACE_POSITION=P: ResidualTrace lines on stderr, compared by scripts/trace_diff.py).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "worker/cpu_model_runner.h"
#include "worker/model_runner.h"

namespace moeshard {
namespace {

// One line a trace: "moeshard trace: position P layer L attention|mlp rank R/N: v0 v1 ...", and
// after an MoE layer's MLP line, where the runner reports its routing, "moeshard trace: position P
// layer L route rank R/N: experts e0 ... logits l0 ...".
ResidualTraceSink StderrTraceSink(const ShardSpec& shard) {
  return [rank = shard.tp_rank, size = shard.tp_size](const ResidualTrace& t) {
    std::string line = "moeshard trace: position " + std::to_string(t.position) + " layer " + std::to_string(t.layer) +
                       (t.block == Block::kAttention ? " attention" : " mlp") + " rank " + std::to_string(rank) + "/" +
                       std::to_string(size) + ":";
    char buf[32];
    for (float v : t.s) {
      std::snprintf(buf, sizeof(buf), " %.9g", v);
      line += buf;
    }
    line += "\n";
    if (!t.experts.empty()) {  // "... route rank R/N: experts e0 e1 ... logits l0 l1 ..."
      line += "moeshard trace: position " + std::to_string(t.position) + " layer " + std::to_string(t.layer) +
              " route rank " + std::to_string(rank) + "/" + std::to_string(size) + ": experts";
      for (int32_t e : t.experts) line += " " + std::to_string(e);
      line += " logits";
      for (float v : t.router_logits) {
        std::snprintf(buf, sizeof(buf), " %.9g", v);
        line += buf;
      }
      line += "\n";
    }
    std::fputs(line.c_str(), stderr);
  };
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const ModelConfig& config, const TensorSource& src,
                                                                 const ShardSpec& shard, const RunnerOptions& options,
                                                                 Communicator* tp_comm) {
  if (shard.tp_size > 1 && (tp_comm == nullptr || tp_comm->size() != shard.tp_size)) {
    return absl::InvalidArgumentError("tensor parallel shard needs a communicator of tp_size ranks");
  }
  if (options.block_size <= 0 || options.num_kv_blocks <= 0) {
    return absl::InvalidArgumentError("KV cache needs a positive block size and block count");
  }
  absl::StatusOr<std::unique_ptr<ModelRunner>> r = options.device == Device::kCuda
                                                      ? CreateGpuModelRunner(config, src, shard, options, tp_comm)
                                                      : CpuModelRunner::Create(config, src, shard, options, tp_comm);
  int64_t position = -1;
  const char* env = std::getenv("MOESHARD_TRACE_POSITION");
  if (r.ok() && env != nullptr) {
    if (!absl::SimpleAtoi(env, &position) || position < 0) {
      return absl::InvalidArgumentError(std::string("MOESHARD_TRACE_POSITION must be a position >= 0, got '") + env + "'");
    }
    (*r)->SetResidualTrace(position, StderrTraceSink(shard));
  }
  return r;
}

}  // namespace moeshard
