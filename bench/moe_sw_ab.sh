#!/usr/bin/env bash
# The wgmma GEMMs over decoded registers (moe_stream_wgmma.cu) against an earlier build, in one GPU
# session (issue 14): the MoE expert step at the issue shape (32 of 256 Muse Spark experts, NVFP4)
# and Muse Spark's 4,096-token prefill, both builds on the same machine, one after the other.
#   bench/moe_sw_ab.sh BASE_BIN NEW_BIN
# BASE_BIN holds the earlier moe_expert_bench and moeshard; NEW_BIN those two and moe_expert_test
# (device bundles' bin/). Steps, each headed by a UTC time:
#   1. moe_expert_test of NEW at the defaults, with every prefill shape split by experts' rows
#      (ctest's moe_expert_test_stream_split) and with 112-token items (_tok112);
#   2. moe_expert_bench, T = 64 .. 8,192, uniform and zipf routing: BASE, then NEW with cuBLAS on
#      bf16 weights in the same run (the floor: the run's own copy and GEMM rates);
#   3. NEW with items of 112 tokens (MOESHARD_MOE_SW_TOK=112) at T = 3,012 and 8,192;
#   4. NEW at split sizes (T = 128, 256, 512): the streaming kernels whole (the default,
#      MOESHARD_MOE_SW_SPLIT_ROWS=0), the experts with 24 or more rows split off to the wgmma GEMMs
#      (=24), and the same with 64-token items;
#   5. moeshard bench-model, Muse Spark 8 full-width NVFP4 layers, 4,096-token prefill: BASE, NEW.
# Exits 1 when a test or a run fails.
set -uo pipefail
base=${1:?usage: moe_sw_ab.sh BASE_BIN NEW_BIN}
new=${2:?usage: moe_sw_ab.sh BASE_BIN NEW_BIN}
# shellcheck source=bench/moe_sw_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/moe_sw_common.sh"
sw_need moe_sw_ab "$base/moe_expert_bench" "$base/moeshard" "$new/moe_expert_bench" "$new/moeshard" \
  "$new/moe_expert_test"
rc=0
sw_test moe_sw_ab "$new/moe_expert_test" defaults
sw_test moe_sw_ab "$new/moe_expert_test" split MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1000000 MOESHARD_MOE_SW_SPLIT_ROWS=48
sw_test moe_sw_ab "$new/moe_expert_test" tok112 MOESHARD_MOE_STREAM_WGMMA_MIN_ROWS=1 MOESHARD_MOE_SW_TOK=112
bench() {  # bench BIN ARGS... (the table's header and rows)
  local bin=$1
  shift
  "$bin/moe_expert_bench" "$@" 2>&1 | grep -E '^(routing|uniform|zipf) ' || rc=1
}
log "moe_expert_bench BASE"
bench "$base" --t 64,256,753,3012,8192 --routing both --skip-baseline
log "moe_expert_bench NEW (cublas_us: cuBLAS on bf16 weights)"
bench "$new" --t 64,256,753,3012,8192 --routing both
log "NEW, MOESHARD_MOE_SW_TOK=112"
MOESHARD_MOE_SW_TOK=112 bench "$new" --t 3012,8192 --routing both --skip-baseline
for v in MOESHARD_MOE_SW_SPLIT_ROWS=0 MOESHARD_MOE_SW_SPLIT_ROWS=24 "MOESHARD_MOE_SW_SPLIT_ROWS=24 MOESHARD_MOE_SW_TOK=64"; do
  log "NEW at split sizes, $v"
  # shellcheck disable=SC2086  # $v is one or two VAR=VALUE words
  env $v "$new/moe_expert_bench" --t 128,256,512 --routing both --skip-baseline 2>&1 |
    grep -E '^(routing|uniform|zipf) ' || rc=1
done
for b in "$base" "$new"; do
  log "bench-model Muse Spark 8 NVFP4 layers, prefill 4096: $b"
  "$b/moeshard" bench-model --arch muse_spark --preset full-layer --layers 8 --expert-format nvfp4 \
    --prompt-len 4096 --decode-steps 2 --streams 1 2>&1 | grep -iE 'prefill|floor' | head -8 || rc=1
done
exit $rc
