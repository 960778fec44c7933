// Conversions between the engine's plain structs and their protobuf messages.
#pragma once

#include "proto/moeshard.pb.h"
#include "worker/sampler.h"

namespace moeshard {

SamplingParams SamplingFromProto(const v1::SamplingOptions& s);
void SamplingToProto(const SamplingParams& p, v1::SamplingOptions* s);

}  // namespace moeshard
