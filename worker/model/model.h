// A model's layer sequence over a backend's LayerOps. One file per architecture writes it
// (qwen3_moe.cc, muse_spark.cc); RunLayerSequence picks the file by config.arch. Adding an
// architecture is one model file (and each backend's op for a new op).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/model/model_config.h"
#include "worker/model/layer_ops.h"

namespace moeshard {

// Runs global layers [layer_begin, layer_end) of config's architecture; ops see local indices
// li = layer - layer_begin. Stops at the first op that fails and returns its status.
absl::Status RunLayerSequence(const ModelConfig& config, int64_t layer_begin, int64_t layer_end, LayerOps& ops);

// The fusion hints of a layer's two residual updates: after attention comes this layer's MLP
// (wanting an fp32 copy of its input when it routes); after the MLP, the next local layer's
// attention, if the shard has one.
inline NextInput NextMlp(const LayerSpec& spec) { return {NextInput::Kind::kMlp, spec.moe}; }
inline NextInput NextAttention(int64_t li, int64_t num_local_layers) {
  return li + 1 < num_local_layers ? NextInput{NextInput::Kind::kAttention, false} : NextInput{};
}

// The per-architecture sequences (the files of this folder).
absl::Status RunQwen3MoeLayers(const ModelConfig& config, int64_t layer_begin, int64_t layer_end, LayerOps& ops);
absl::Status RunMuseSparkLayers(const ModelConfig& config, int64_t layer_begin, int64_t layer_end, LayerOps& ops);

}  // namespace moeshard
