// Where a warp of the direct decode GEMV over repacked experts (moe_stream_direct.cu) is in its
// block's work, for host and device alike (tests/kernels/moe_unit_cursor_test.cc walks it on the CPU).
// A unit is one local pair's row tile: units u = local pair index · R + row tile, of which block b
// takes b, b + grid, b + 2 · grid, ...; each unit is nch chunks a warp. The pairs whose experts are on
// other GPUs are not in `local` (the step's pair indices whose experts are here, in order), so their
// units are never visited. Free of CUDA headers.
#pragma once

#include <cstdint>

#include "kernels/cuda/lane_ops.h"

namespace moeshard::gpu {

// Units and chunks, advanced chunk by chunk with the divisions once a unit (by R, and gate/up's by
// top_k): divisions by the runtime R and nch on every chunk were a third of the GEMV loop's
// instructions (ncu, kernels/moe/PERF_NOTES.md).
struct UnitCursor {
  int u;      // the unit (below kMoeDirectMaxPairs · R + grid: far below 2^31)
  int j = 0;  // the chunk within the unit
  int pair;   // the pair (an index of the step's pairs)
  int row;    // its activations' row: the pair's token (gate/up) or the pair (down)
  int rt;     // the row tile
  template <bool kGateUp>
  MOESHARD_LANE_HD void Seek(const int32_t* local, int R, int top_k) {
    const int li = u / R;
    pair = local[li], rt = u - li * R;
    row = kGateUp ? pair / top_k : pair;
  }
  // The next chunk; past the block's last unit (`units`: every local unit of the step) the cursor
  // only counts.
  template <bool kGateUp>
  MOESHARD_LANE_HD void Next(const int32_t* local, int R, int top_k, int nch, int units, int grid) {
    if (++j == nch) {
      j = 0;
      u += grid;
      if (u < units) Seek<kGateUp>(local, R, top_k);
    }
  }
};

// The units block b of `grid` takes.
MOESHARD_LANE_HD int UnitsOfBlock(int units, int b, int grid) { return b < units ? (units - 1 - b) / grid + 1 : 0; }

}  // namespace moeshard::gpu
