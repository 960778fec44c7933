// The MoE kernels' environment knobs (benchmarks and tests set them; production leaves them
// unset): an integer, or `def` when the variable is unset or empty. Callers read it once, into a
// function-local static.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>

namespace moeshard::gpu {

inline int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : def;
}

// A switch on by default: off when the variable's value starts with 0.
inline bool EnvOn(const char* name) {
  const char* v = std::getenv(name);
  return !(v && v[0] == '0');
}

// MOESHARD_MOE_DOWN_EARLY: the direct down kernels (moe_stream_direct.cu, moe_direct.cu,
// moe_gemv.cu) issue their first weights before their wait; a value starting with 0 makes them wait
// first. Read once, the same for all three.
inline bool MoeDownEarly() {
  static const bool on = EnvOn("MOESHARD_MOE_DOWN_EARLY");
  return on;
}

// Tests' hold on the direct GEMV's form (moe_expert.h SetMoeDirectWarpFormForTest): mask -1 leaves
// it to the environment; max_blocks > 0 caps the warp form's grid.
struct DirectWarpTestHold {
  std::atomic<int> mask{-1};
  std::atomic<int> max_blocks{0};
};
inline DirectWarpTestHold& DirectWarpHold() {
  static DirectWarpTestHold hold;
  return hold;
}

// MOESHARD_MOE_DIRECT_WARP: which launches of the direct GEMV over repacked experts take the warp
// form (moe_stream_direct_warp.cu: a warp a 16-row slice over the whole of K, no block barriers)
// instead of the block form (moe_stream_direct.cu): bit 1 down, bit 2 gate/up (default 0: neither);
// from MOESHARD_MOE_DIRECT_WARP_MIN pairs a step (default 1); bit 4: either form's units are an
// expert's pairs together (StreamDirectWarpGrouped, StreamDirectBlockGrouped). Every form gives the
// same bits.
inline int StreamDirectWarpMask() {
  static const int mask = EnvInt("MOESHARD_MOE_DIRECT_WARP", 0);
  const int held = DirectWarpHold().mask.load(std::memory_order_relaxed);
  return held >= 0 ? held : mask;
}
inline bool StreamDirectWarpForm(bool gate_up, int64_t pairs) {
  static const int from = EnvInt("MOESHARD_MOE_DIRECT_WARP_MIN", 1);
  const bool held = DirectWarpHold().mask.load(std::memory_order_relaxed) >= 0;  // a test's: every size
  return (StreamDirectWarpMask() & (gate_up ? 2 : 1)) != 0 && (held || pairs >= from);
}
inline bool StreamDirectWarpGrouped() { return (StreamDirectWarpMask() & 4) != 0; }
// The block form's units grouped the same way (stream_direct::Group): by default from
// MOESHARD_MOE_DIRECT_GROUP_FROM tokens a step (default 5; 0: never), where reading an expert once
// for the tokens that share it outweighs building the groups (H100, 2026-12-07, Qwen3-30B shape:
// 4 tokens +2.5 % a step with MXFP4 experts, 5 level, 8 -4 %; Q8_0 -1 % to -9.6 %;
// kernels/moe/PERF_NOTES.md); with bit 4 at every step of several tokens (one token's pairs are
// eight experts: nothing to share); while a test holds the mask, exactly as bit 4 says.
inline bool StreamDirectBlockGrouped(int64_t tokens) {
  static const int from = EnvInt("MOESHARD_MOE_DIRECT_GROUP_FROM", 5);
  if (DirectWarpHold().mask.load(std::memory_order_relaxed) >= 0) return StreamDirectWarpGrouped();
  return (StreamDirectWarpGrouped() && tokens > 1) || (from > 0 && tokens >= from);
}

// The block form's grid (moe_stream_direct.cu, one resident wave): at most
// MOESHARD_MOE_DIRECT_PER_SM_GATEUP / MOESHARD_MOE_DIRECT_PER_SM_DOWN blocks an SM for gate/up /
// down (default 0: as many as fit, 4 of the e2m1 kernels) from MOESHARD_MOE_DIRECT_PER_SM_FROM
// tokens a step (default 1). Fewer gate/up blocks leave room for down's blocks to be resident
// and stage their first weights before gate/up ends (kEarly), which a full wave of gate/up
// blocks prevents from four tokens a step (the probe, 2026-12-07: down's last block started
// 7.9 µs after its release at four streams). The grid does not change any result's bits.
inline int StreamDirectBlocksPerSm(bool gate_up, int64_t tokens) {
  static const int gu = EnvInt("MOESHARD_MOE_DIRECT_PER_SM_GATEUP", 0);
  static const int down = EnvInt("MOESHARD_MOE_DIRECT_PER_SM_DOWN", 0);
  static const int from = EnvInt("MOESHARD_MOE_DIRECT_PER_SM_FROM", 1);
  return tokens >= from ? (gate_up ? gu : down) : 0;
}

}  // namespace moeshard::gpu
