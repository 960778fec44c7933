#include "worker/model/model.h"

#include "absl/strings/str_cat.h"

namespace moeshard {

absl::Status RunLayerSequence(const ModelConfig& config, int64_t layer_begin, int64_t layer_end, LayerOps& ops) {
  if (layer_begin < 0 || layer_end < layer_begin || layer_end > static_cast<int64_t>(config.layers.size())) {
    return absl::InvalidArgumentError(absl::StrCat("layers [", layer_begin, ", ", layer_end, ") outside the model's ",
                                                   config.layers.size()));
  }
  switch (config.arch) {
    case Arch::kQwen3Moe:
      return RunQwen3MoeLayers(config, layer_begin, layer_end, ops);
    case Arch::kMuseSpark:
      return RunMuseSparkLayers(config, layer_begin, layer_end, ops);
  }
  return absl::InvalidArgumentError(absl::StrCat("no layer sequence for architecture '", config.model_type, "'"));
}

}  // namespace moeshard
