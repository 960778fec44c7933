// The engine's plain structs to and from the coordinator's protobuf messages (the gRPC
// service converts at its edge; the engine never sees a message).
#pragma once

#include "coordinator/engine.h"
#include "proto/moeshard.pb.h"

namespace moeshard {

EngineRequest FromProto(const v1::SeqRequest& request);
void ToProto(const SeqUpdate& update, v1::SeqUpdate* message);
void ToProto(const EngineStatus& status, v1::StatusReply* message);

}  // namespace moeshard
