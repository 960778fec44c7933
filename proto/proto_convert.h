// Conversions between the plain structs of common/ and their protobuf messages, and the
// version of the worker protocol (the handshake refuses any other).
#pragma once

#include <cstdint>

#include "common/sampling/sampling_params.h"
#include "proto/moeshard.pb.h"

namespace moeshard {

// 2: ChunkProto.table_start (tables by delta); 3: the sliding pool (num_sliding_kv_blocks,
// ChunkProto.sliding_table).
inline constexpr uint32_t kProtocolVersion = 4;  // 4: ChunkProto.follow

SamplingParams SamplingFromProto(const v1::SamplingOptions& s);
void SamplingToProto(const SamplingParams& p, v1::SamplingOptions* s);

}  // namespace moeshard
