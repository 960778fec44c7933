// The current CUDA device's properties that launch rules read on every call, each read once a
// device. Host-only declarations (no Abseil, no device code): .cu and .cc sources include it alike.
#pragma once

namespace moeshard::gpu {

// The current device's multiprocessor count; 0 where CUDA cannot say (its error cleared), which
// each caller maps to its own fallback.
int DeviceSmCount();

}  // namespace moeshard::gpu
