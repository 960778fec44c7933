// MOESHARD_REPEAT_OPS: a benchmark knob of the GPU runner. Each named op is launched twice a
// step (each is idempotent: it rewrites the same outputs from the same inputs), so that the
// difference in bench-model's step time is what one more of it costs inside the decode chain —
// launch, programmatic-dependent-launch overlap and tail included, which a kernel timed alone
// does not show. Names, comma-separated: qkv, attention, o, router, routing, experts, lmhead.
#pragma once

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace moeshard::gpu_runner {

enum RepeatOp : uint32_t {
  kRepeatQkv = 1,
  kRepeatAttention = 2,
  kRepeatO = 4,
  kRepeatRouter = 8,
  kRepeatRouting = 16,
  kRepeatExperts = 32,
  kRepeatLmHead = 64,
};

inline absl::StatusOr<uint32_t> ParseRepeatOps(absl::string_view list) {
  static constexpr struct {
    absl::string_view name;
    RepeatOp op;
  } kOps[] = {{"qkv", kRepeatQkv},       {"attention", kRepeatAttention}, {"o", kRepeatO},
              {"router", kRepeatRouter}, {"routing", kRepeatRouting},     {"experts", kRepeatExperts},
              {"lmhead", kRepeatLmHead}};
  uint32_t mask = 0;
  for (absl::string_view name : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    bool found = false;
    for (const auto& o : kOps) {
      if (o.name == name) {
        mask |= o.op;
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MOESHARD_REPEAT_OPS: unknown op \"", name, "\" (known: qkv, attention, o, router, routing, experts, lmhead)"));
    }
  }
  return mask;
}

}  // namespace moeshard::gpu_runner
