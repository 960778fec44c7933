#!/usr/bin/env bash
# Where the wgmma GEMMs over decoded registers (kernels/moe/moe_stream_wgmma.cu) spend their time,
# in one GPU session (issue 14; kernels/moe/PERF_NOTES.md has the first answers):
#   1. moe_expert_test with the kernels at every size past the direct GEMV's;
#   2. moe_expert_bench at the issue shape (T = 753 and 3,012), each kernel alone (--stages),
#      the landed kernels, then each probe (MOESHARD_MOE_SW_PROBE: 3 no activation copies, 4 no
#      weight copies, 5 no copies; the results are then wrong), then the streaming kernels for
#      scale;
#   3. with ncu on the PATH: the two GEMMs of one T = 753 and one T = 3,012 step — duration, the
#      tensor pipe's and DRAM's use, and where the warps wait instruction by instruction (the
#      source page's stall samples through bench/ncu_stalls.py).
#   bench/moe_sw_profile.sh BIN_DIR [OUT_DIR]
# BIN_DIR holds moe_expert_test and moe_expert_bench (a device bundle's bin/).
set -uo pipefail
bin=${1:?usage: moe_sw_profile.sh BIN_DIR [OUT_DIR]}
out=${2:-/tmp}
# shellcheck source=bench/moe_sw_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/moe_sw_common.sh"
sw_need moe_sw_profile "$bin/moe_expert_test" "$bin/moe_expert_bench"
rc=0
log "moe_expert_test, MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1"
MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 "$bin/moe_expert_test" > "$out/moe_sw_test.log" 2>&1 || rc=1
grep -E "paths|^\[  (FAILED|PASSED) |Failure" "$out/moe_sw_test.log" | head -12
for env in X=0 MOESHARD_MOE_SW_PROBE=3 MOESHARD_MOE_SW_PROBE=4 MOESHARD_MOE_SW_PROBE=5 \
  MOESHARD_MOE_STREAM_WGMMA=0; do
  log "moe_expert_bench $env (MIN_ROWS=1: the new kernels at both T)"
  env MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 "$env" "$bin/moe_expert_bench" --t 753,3012 --routing uniform \
    --skip-baseline --stages 2>&1 | grep -E "^uniform|stages_us" || rc=1
done
if command -v ncu > /dev/null; then
  here=$(cd "$(dirname "$0")" && pwd)
  for t in 753 3012; do
    log "ncu, one T = $t step: speed of light, then the stalls instruction by instruction"
    MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 ncu --clock-control none -k regex:StreamWgmma -c 2 --set full \
      --import-source no -o "$out/moe_sw_$t" "$bin/moe_expert_bench" --t "$t" --routing uniform --skip-baseline \
      --iters 1 > "$out/moe_sw_ncu_$t.txt" 2>&1 || rc=1
    ncu -i "$out/moe_sw_$t.ncu-rep" --page details --print-details all > "$out/moe_sw_details_$t.txt" 2>&1 || rc=1
    grep -E "StreamWgmma|Duration|Tensor Cycles Active|DRAM Throughput|Issue Slots Busy|No Eligible" \
      "$out/moe_sw_details_$t.txt" | sed -E 's/ +/ /g' | cut -c1-160 | head -20
    ncu -i "$out/moe_sw_$t.ncu-rep" --page source --csv --print-source sass > "$out/moe_sw_source_$t.csv" 2>&1 || rc=1
    python3 "$here/ncu_stalls.py" "$out/moe_sw_source_$t.csv" --kernel 0 --top 25 || rc=1
  done
fi
exit $rc
