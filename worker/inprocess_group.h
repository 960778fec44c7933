// Several runners of one model inside this process acting as one ModelRunner, for the
// commands that check and evaluate layouts without a cluster (`moeshard check`, `eval`):
// - tensor parallel over `tp` ranks: one runner per rank, each driven by its own thread,
//   all-reducing through a LocalGroup (host memory; on a GPU this is the host-staged path);
// - layer split over `stages` runners of contiguous layer ranges (SplitLayers with equal
//   weights, as the coordinator's plan: sizes differ by at most one), the hidden state handed
//   from stage to stage.
// With tp == 1 and stages == 1 this is ModelRunner::Create. Not thread-safe.
#pragma once

#include <memory>

#include "worker/model_runner.h"

namespace moeshard {

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateInProcessRunner(const ModelConfig& config, const TensorSource& src,
                                                                   const RunnerOptions& options, int tp, int stages);

}  // namespace moeshard
