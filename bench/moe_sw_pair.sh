#!/usr/bin/env bash
# The pair step of the wgmma GEMMs over decoded registers (kernels/moe/moe_stream_wgmma.cu; issue 14)
# in one GPU session: the two-CTA 32-token kernel for the experts of at most 32 rows beside the
# 128-token kernel for the rest, with items strided over the grid or drawn from a counter.
#   bench/moe_sw_pair.sh BIN_DIR
# BIN_DIR holds moe_expert_test and moe_expert_bench (a device bundle's bin/). Steps, each headed by a
# UTC time:
#   1. moe_expert_test at the defaults, with the pair step forced (ctest's
#      moe_expert_test_stream_wgmma_pair) and forced with the counter and the 128-token kernel first
#      (_pair_dyn);
#   2. moe_expert_bench at the sizes where the host's rule takes the pair (T = 640 .. 800 at the issue
#      shape), uniform and zipf routing, twice, each variant on the same routing draws:
#      64-token items (MOESHARD_MOE_SW_PAIR=0), the pair with items strided over the grid
#      (MOESHARD_MOE_SW_DYN=0), the two-CTA kernel first (=1) or the 128-token kernel first (=2), and
#      the default since 2026-12-06: =2 with the counter (MOESHARD_MOE_SW_DYN=1).
#      Not --stages: those times include the memset that zeroes the item counters (MoeExpertStepStages).
# Exits 1 when a test or a run fails.
set -uo pipefail
bin=${1:?usage: moe_sw_pair.sh BIN_DIR}
# shellcheck source=bench/moe_sw_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/moe_sw_common.sh"
sw_need moe_sw_pair "$bin/moe_expert_test" "$bin/moe_expert_bench"
rc=0
sw_test moe_sw_pair "$bin/moe_expert_test" defaults
sw_test moe_sw_pair "$bin/moe_expert_test" pair MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 MOESHARD_MOE_SW_PAIR=3 \
  MOESHARD_MOE_SW_DYN=0
sw_test moe_sw_pair "$bin/moe_expert_test" pair_dyn MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 MOESHARD_MOE_SW_PAIR=4 \
  MOESHARD_MOE_SW_DYN=1
for rep in 1 2; do
  for v in MOESHARD_MOE_SW_PAIR=0 "MOESHARD_MOE_SW_PAIR=1 MOESHARD_MOE_SW_DYN=0" \
    "MOESHARD_MOE_SW_PAIR=2 MOESHARD_MOE_SW_DYN=0" "MOESHARD_MOE_SW_PAIR=2 MOESHARD_MOE_SW_DYN=1"; do
    log "repetition $rep, $v: routing T pairs time_us ratio path"
    # shellcheck disable=SC2086  # $v is one or two VAR=VALUE words
    env $v "$bin/moe_expert_bench" --t 640,700,753,800 --routing both --skip-baseline 2>&1 |
      grep -E '^(uniform|zipf) ' | awk '{print "  " $1, $2, $3, $5, $9, $13}' || rc=1
  done
done
exit $rc
